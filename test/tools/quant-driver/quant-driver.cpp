//===- quant-driver.cpp - Raw-file front end to utils/quant ---------------===//
//
// Lets Python tests compare Kiln's (de)quantisers with gguf-py on raw,
// little-endian files, with no GGUF container around them:
//   quant-driver dequant TYPE IN.bin OUT.f32     blocks -> float32 values
//   quant-driver quantize TYPE IN.f32 OUT.bin    float32 values -> blocks
//   quant-driver scales-finite TYPE IN.bin       "ok" or "bad block N"
// Exit status: 0 success, 1 a reported error, 2 bad usage.
//
//===----------------------------------------------------------------------===//
#include "quant/QuantFormats.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using namespace kiln;

namespace {

int fail(const std::string &message) {
  std::fprintf(stderr, "quant-driver: error: %s\n", message.c_str());
  return 1;
}

int usage() {
  std::fprintf(stderr, "usage: quant-driver dequant TYPE IN.bin OUT.f32\n"
                       "       quant-driver quantize TYPE IN.f32 OUT.bin\n"
                       "       quant-driver scales-finite TYPE IN.bin\n");
  return 2;
}

Expected<std::vector<uint8_t>> readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Error(path, "", "cannot open for reading");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  if (in.bad())
    return Error(path, "", "read failed");
  return bytes;
}

Status writeFile(const std::string &path, const void *data, size_t size) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char *>(data),
            static_cast<std::streamsize>(size));
  if (!out)
    return Error(path, "", "write failed");
  return Status::ok();
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 4)
    return usage();
  std::string command = argv[1];
  std::optional<GGMLType> type = parseGGMLType(argv[2]);
  if (!type)
    return fail(std::string("unknown type '") + argv[2] + "'");
  Expected<std::vector<uint8_t>> input = readFile(argv[3]);
  if (!input)
    return fail(input.error().message());
  const GGMLTypeTraits &traits = traitsOf(*type);

  if (command == "dequant" && argc == 5) {
    // Whole blocks in, their values out; a ragged file is the library's
    // size error to report.
    uint64_t values = input->size() / traits.blockBytes * traits.blockSize;
    std::vector<float> out(values);
    if (Status s = dequantize(*type, *input, out); !s)
      return fail(s.error().withWhere(argv[3]).message());
    Status s = writeFile(argv[4], out.data(), out.size() * sizeof(float));
    return s ? 0 : fail(s.error().message());
  }
  if (command == "quantize" && argc == 5) {
    if (input->size() % sizeof(float) != 0)
      return fail(std::string(argv[3]) + ": not a whole number of float32s");
    std::vector<float> values(input->size() / sizeof(float));
    std::memcpy(values.data(), input->data(), input->size());
    uint64_t bytes = values.size() / traits.blockSize * traits.blockBytes;
    std::vector<uint8_t> out(bytes);
    if (Status s = quantize(*type, values, out); !s)
      return fail(s.error().withWhere(argv[3]).message());
    Status s = writeFile(argv[4], out.data(), out.size());
    return s ? 0 : fail(s.error().message());
  }
  if (command == "scales-finite" && argc == 4) {
    uint64_t bad = 0;
    if (blockScalesFinite(*type, *input, &bad))
      std::printf("ok\n");
    else
      std::printf("bad block %llu\n", static_cast<unsigned long long>(bad));
    return 0;
  }
  return usage();
}
