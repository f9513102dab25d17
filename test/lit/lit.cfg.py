# lit configuration of Kiln's FileCheck tests (kiln-opt over .mlir files).
import os

import lit.formats
from lit.llvm import llvm_config

config.name = "Kiln"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = config.kiln_obj_root
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "Inputs"]

llvm_config.use_default_substitutions()
# FileCheck, not and count come from the installed LLVM; kiln-opt from the build.
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.add_tool_substitutions(["kiln-opt", "kiln-compile", "kiln-gguf"],
                                   [config.kiln_tools_dir])
