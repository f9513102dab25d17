//===- gguf-roundtrip.cpp - Rewrite a GGUF file through Kiln's writer -----===//
//
// Test driver: reads IN with GGUFFile and writes OUT with GGUFWriter, keeping
// metadata (in order) and tensors (infos and bytes) but choosing the data
// alignment. Lets the Python tests check Kiln-written files with gguf-py.
//
//   gguf-roundtrip IN OUT [--alignment N] [--no-data]
//
// --no-data writes a metadata-only file (tensor data left as a sparse hole).
//
//===----------------------------------------------------------------------===//
#include "gguf/GGUFFile.h"
#include "gguf/GGUFWriter.h"

#include <fmt/core.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

using namespace kiln;
using namespace kiln::gguf;

int main(int argc, char **argv) {
  constexpr std::string_view kUsage =
      "usage: gguf-roundtrip IN OUT [--alignment N] [--no-data]\n";
  std::vector<std::string> files;
  uint32_t alignment = kDefaultAlignment;
  bool data = true;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--alignment" && i + 1 < argc) {
      alignment = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (arg == "--no-data") {
      data = false;
    } else if (arg.starts_with("-")) {
      fmt::print(stderr, "{}", kUsage);
      return 2;
    } else {
      files.emplace_back(arg);
    }
  }
  if (files.size() != 2) {
    fmt::print(stderr, "{}", kUsage);
    return 2;
  }
  Expected<GGUFFile> in = GGUFFile::open(files[0]);
  if (!in) {
    fmt::print(stderr, "gguf-roundtrip: error: {}\n", in.error().message());
    return 1;
  }
  GGUFWriter writer(alignment);
  for (const auto &[key, value] : in->metadata())
    if (key != kAlignmentKey) // The writer adds its own.
      writer.addMetadata(key, value);
  for (const TensorInfo &t : in->tensors())
    writer.addTensor({t.name, t.type, t.dims});
  TensorFill fill;
  if (data)
    fill = [&](size_t index, uint64_t offset, std::span<uint8_t> out) {
      std::span<const uint8_t> src = in->tensorData(in->tensors()[index]);
      std::memcpy(out.data(), src.data() + offset, out.size());
      return Status::ok();
    };
  if (Status s = writer.write(files[1], fill); !s) {
    fmt::print(stderr, "gguf-roundtrip: error: {}\n", s.error().message());
    return 1;
  }
  return 0;
}
