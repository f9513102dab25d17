//===- DequantCommand.cpp - kiln-gguf dequant: a tensor as raw float32 -----===//
//
// Writes one tensor dequantised by the reference dequantisers, as raw
// little-endian float32 in GGUF element order (ne[0] fastest), atomically.
// Rows are converted a bounded chunk at a time, so any tensor size works in
// constant memory.
//
//===----------------------------------------------------------------------===//
#include "gguf/GGUFFile.h"
#include "quant/QuantFormats.h"
#include "support/AtomicFile.h"
#include "support/Progress.h"
#include "tool/Commands.h"

#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <vector>

static_assert(std::endian::native == std::endian::little,
              "dequant writes float32 in host byte order");

namespace kiln::gguf::tool {
namespace {

constexpr std::string_view kUsage =
    "usage: kiln-gguf dequant FILE... --tensor NAME -o OUT\n"
    "  Writes tensor NAME dequantised to raw little-endian float32 in GGUF\n"
    "  element order (ne[0] fastest) into OUT, which appears only when\n"
    "  complete.\n";

/// Values converted per step: bounds memory, amortises calls.
constexpr uint64_t kChunkValues = uint64_t(1) << 22;

} // namespace

int runDequant(int argc, char **argv) {
  std::vector<std::string> paths;
  std::string tensorName, out;
  for (int i = 0; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    }
    if (arg == "--tensor" || arg == "-o") {
      if (i + 1 >= argc)
        return usageError("dequant", fmt::format("{} needs a value", arg),
                          kUsage);
      (arg == "-o" ? out : tensorName) = argv[++i];
      continue;
    }
    if (arg.starts_with("-"))
      return usageError("dequant", fmt::format("unknown option '{}'", arg),
                        kUsage);
    paths.emplace_back(arg);
  }
  if (paths.empty() || tensorName.empty() || out.empty())
    return usageError("dequant", "needs FILE..., --tensor NAME and -o OUT",
                      kUsage);

  Expected<GGUFModel> model = GGUFModel::open(paths);
  if (!model)
    return reportError(model.error());
  std::optional<TensorRef> ref = model->findTensor(tensorName);
  if (!ref)
    return reportError(Error(model->parts().front().path(), tensorName,
                             "no such tensor"));
  const TensorInfo &info = model->info(*ref);
  const std::string &part = model->parts()[ref->part].path();
  if (!canDequantize(info.type))
    return reportError(Error(part, info.name,
                             fmt::format("unsupported type {} for tensor {}",
                                         nameOf(info.type), info.name)));

  std::span<const uint8_t> data = model->tensorData(*ref);
  const GGMLTypeTraits &traits = traitsOf(info.type);
  // Whole blocks per chunk; the reader guarantees whole blocks overall.
  uint64_t chunkValues =
      std::max<uint64_t>(1, kChunkValues / traits.blockSize) * traits.blockSize;
  AtomicFile file;
  if (Status s = file.create(out); !s)
    return reportError(s.error());
  std::vector<float> values;
  ProgressBar progress("dequant", info.elements * sizeof(float));
  for (uint64_t first = 0; first < info.elements; first += chunkValues) {
    progress.update(first * sizeof(float));
    uint64_t n = std::min(chunkValues, info.elements - first);
    values.resize(n);
    uint64_t byteOffset = first / traits.blockSize * traits.blockBytes;
    uint64_t byteCount = n / traits.blockSize * traits.blockBytes;
    if (Status s = dequantize(info.type, data.subspan(byteOffset, byteCount),
                              values);
        !s)
      return reportError(Error(part, info.name, s.error().message()));
    if (Status s = file.writeAt(values.data(), n * sizeof(float),
                                first * sizeof(float));
        !s)
      return reportError(s.error());
  }
  progress.update(info.elements * sizeof(float));
  progress.finish();
  if (Status s = file.commit(); !s)
    return reportError(s.error());
  return 0;
}

} // namespace kiln::gguf::tool
