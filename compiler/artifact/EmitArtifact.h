//===- EmitArtifact.h - Step programs to .kiln artifacts --------*- C++ -*-===//
#ifndef KILN_COMPILER_ARTIFACT_EMITARTIFACT_H
#define KILN_COMPILER_ARTIFACT_EMITARTIFACT_H

#include "artifact/Artifact.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <functional>
#include <string>

namespace kiln::compiler {

/// A compile-side backend: what `--target=NAME` selects. It checks that it
/// can run every op of the planned step program and adds its payloads
/// (kernel images, later) to the artifact.
struct Target {
  std::string name;
  std::string description;
  /// The op kinds (step mnemonics without "step.") the backend runs.
  std::vector<std::string> supportedOps;
  /// Adds backend payloads; may refuse the program with an error.
  std::function<Status(mlir::ModuleOp, artifact::Artifact &)> emitPayloads;
  /// Applies the target's options (the text after ':' in --target=NAME:OPTS;
  /// empty when none were given) to the artifact, or refuses them.
  std::function<Status(llvm::StringRef, artifact::Artifact &)> applyOptions;
};

/// Where the cuda target finds the kernel images it copies into an
/// artifact: DIR/sm_XX/NAME.fatbin (kiln-compile --cuda-images).
void setCudaImageDir(std::string dir);

/// Every registered target, in registration order.
llvm::ArrayRef<Target> targets();
/// The target named `name`, or null.
const Target *lookupTarget(llvm::StringRef name);

/// Builds the artifact of a planned, capture-verified step module for one
/// rank: the model config (from `kiln.config`), one Step per step function,
/// the weight bindings (one per distinct GGUF tensor), the cache context.
/// Fails, naming the op, on anything the artifact cannot express or the
/// target cannot run.
Expected<artifact::Artifact> emitArtifact(mlir::ModuleOp module,
                                          const Target &target,
                                          const std::string &producer);

} // namespace kiln::compiler

#endif // KILN_COMPILER_ARTIFACT_EMITARTIFACT_H
