//===- kiln-compile.cpp - The Kiln compiler driver -------------------------===//
//
// kiln-compile MODEL.gguf... [--emit=mlir] [-o OUT]
// kiln-compile config.json --weight-type=bf16 [--emit=mlir] [-o OUT]
//
// Reads only the model's metadata (GGUF header and tensor infos, or a
// HuggingFace config.json), checks every tensor the program will bind, and
// prints the GLM-5 decode step in the kiln dialect. Later stages (fusion,
// partitioning, the step dialect, backends, the artifact) extend this
// driver.
//
//===----------------------------------------------------------------------===//
#include "glm5/GLM5Builder.h"
#include "glm5/GLM5Config.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace cl = llvm::cl;

static cl::list<std::string> inputs(cl::Positional, cl::OneOrMore,
                                    cl::desc("<model.gguf... | config.json>"));
static cl::opt<std::string> emit("emit", cl::init("mlir"),
                                 cl::desc("What to produce: mlir (the kiln "
                                          "program)"),
                                 cl::value_desc("kind"));
static cl::opt<std::string> output("o", cl::init("-"),
                                   cl::desc("Output file ('-' for stdout)"),
                                   cl::value_desc("file"));
static cl::opt<uint64_t>
    contextLength("context", cl::init(0),
                  cl::desc("Positions the caches hold (default: the model's "
                           "context length)"));
static cl::opt<bool> mtp("mtp", cl::init(false),
                         cl::desc("Also build @mtp_step, the next-token-"
                                  "prediction layer"));
static cl::opt<std::string>
    weightType("weight-type", cl::init("bf16"),
               cl::desc("With config.json: the type the checkpoint's "
                        "matrices are stored in"),
               cl::value_desc("ggml type"));

static int fail(const kiln::Error &error) {
  llvm::errs() << "kiln-compile: error: " << error.message() << "\n";
  return 1;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::ParseCommandLineOptions(argc, argv, "Kiln compiler driver\n");
  if (emit != "mlir") {
    llvm::errs() << "kiln-compile: error: --emit=" << emit
                 << ": only 'mlir' exists so far\n";
    return 2;
  }

  kiln::Expected<kiln::glm5::GLM5Dims> dims = kiln::Error("", "", "");
  kiln::Expected<kiln::glm5::TensorCatalog> catalog = kiln::Error("", "", "");
  std::string first = inputs.front();
  if (llvm::StringRef(first).ends_with(".json")) {
    if (inputs.size() != 1) {
      llvm::errs() << "kiln-compile: error: a config.json is the only input\n";
      return 2;
    }
    std::optional<kiln::GGMLType> type = kiln::parseGGMLType(weightType);
    if (!type) {
      llvm::errs() << "kiln-compile: error: --weight-type: unknown type '"
                   << weightType << "'\n";
      return 2;
    }
    dims = kiln::glm5::dimsFromConfigJson(first);
    if (!dims)
      return fail(dims.error());
    catalog = kiln::glm5::TensorCatalog::expected(*dims, *type, first);
  } else {
    std::vector<std::string> paths(inputs.begin(), inputs.end());
    kiln::Expected<kiln::gguf::GGUFModel> model =
        kiln::gguf::GGUFModel::open(paths);
    if (!model)
      return fail(model.error());
    dims = kiln::glm5::dimsFromGGUF(*model);
    if (!dims)
      return fail(dims.error());
    catalog = kiln::glm5::TensorCatalog::fromGGUF(*model);
  }
  if (!catalog)
    return fail(catalog.error());

  mlir::MLIRContext context;
  kiln::glm5::BuildOptions options;
  options.contextLength = contextLength;
  options.includeMtp = mtp;
  auto module = kiln::glm5::buildDecodeStep(context, *dims, *catalog, options);
  if (!module)
    return fail(module.error());

  std::string errorMessage;
  auto out = mlir::openOutputFile(output, &errorMessage);
  if (!out) {
    llvm::errs() << "kiln-compile: error: " << output << ": " << errorMessage
                 << "\n";
    return 1;
  }
  (*module)->print(out->os());
  out->os() << "\n";
  out->keep();
  return 0;
}
