//===- CheckCommand.cpp - kiln-gguf check: structural validation
//-----------===//
//
// Opening a model already validates its structure (header, every metadata
// value, tensor geometry and placement, split-set consistency); check then
// walks each tensor's data for the checks that need its bytes.
//
//===----------------------------------------------------------------------===//
#include "gguf/GGUFFile.h"
#include "quant/QuantFormats.h"
#include "support/Progress.h"
#include "tool/Commands.h"

#include <fmt/core.h>

#include <vector>

namespace kiln::gguf::tool {
namespace {

constexpr std::string_view kUsage =
    "usage: kiln-gguf check FILE...\n"
    "  Validates a GGUF model (one file, or every part of a split set; one\n"
    "  part finds the others by name) and prints OK, or the first problem\n"
    "  as 'kiln-gguf: error: FILE: FIELD: PROBLEM' with exit status 1.\n";

/// Checks that read a tensor's bytes: every block's scales are finite (a
/// NaN or infinite scale poisons every value of its block).
Status checkTensorData(const GGUFModel &model, TensorRef ref) {
  const TensorInfo &info = model.info(ref);
  uint64_t badBlock = 0;
  if (!blockScalesFinite(info.type, model.tensorData(ref), &badBlock))
    return Error(model.parts()[ref.part].path(), info.name,
                 fmt::format("block {} has a non-finite scale", badBlock));
  return Status::ok();
}

} // namespace

int runCheck(int argc, char **argv) {
  std::vector<std::string> paths;
  for (int i = 0; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    }
    if (arg.starts_with("-") && arg != "-")
      return usageError("check", fmt::format("unknown option '{}'", arg),
                        kUsage);
    paths.emplace_back(arg);
  }
  if (paths.empty())
    return usageError("check", "no file given", kUsage);
  Expected<GGUFModel> model = GGUFModel::open(paths);
  if (!model)
    return reportError(model.error());
  uint64_t bytes = 0;
  for (TensorRef ref : model->tensors())
    bytes += model->info(ref).bytes;
  // Reading every block of a real model takes minutes: show progress.
  ProgressBar progress("check", bytes);
  uint64_t done = 0;
  for (TensorRef ref : model->tensors()) {
    if (Status s = checkTensorData(*model, ref); !s) {
      progress.finish();
      return reportError(s.error());
    }
    done += model->info(ref).bytes;
    progress.update(done);
  }
  progress.finish();
  fmt::print("OK: {} part{}, {} metadata keys, {} tensors, {} bytes of "
             "tensor data\n",
             model->parts().size(), model->parts().size() == 1 ? "" : "s",
             model->metadata().size(), model->tensors().size(), bytes);
  return 0;
}

} // namespace kiln::gguf::tool
