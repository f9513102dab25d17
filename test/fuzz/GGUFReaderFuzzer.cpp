//===- GGUFReaderFuzzer.cpp - libFuzzer target for the GGUF reader ---------===//
//
// Feeds arbitrary bytes to GGUFFile and, when they parse, walks everything a
// caller could then touch (metadata accessors, every tensor's data span, the
// split-set join), so that ASan/UBSan see any read the validation let
// through. Built and run by utils/fuzz.sh.
//
//===----------------------------------------------------------------------===//
#include "gguf/GGUFFile.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace {

uint64_t walk(const kiln::gguf::Value &v) {
  uint64_t h = static_cast<uint64_t>(v.type());
  if (auto u = v.asUInt())
    h += *u;
  if (auto f = v.asFloat())
    h += static_cast<uint64_t>(*f != 0);
  if (const std::string *s = v.asString())
    h += s->size();
  for (const kiln::gguf::Value &e : v.elements())
    h += walk(e);
  return h;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace kiln::gguf;
  kiln::Expected<GGUFFile> file = GGUFFile::fromBytes(
      "fuzz.gguf", std::vector<uint8_t>(data, data + size));
  if (!file) {
    volatile size_t n = file.error().message().size();
    (void)n;
    return 0;
  }
  volatile uint64_t sink = 0;
  for (const auto &[key, value] : file->metadata())
    sink = sink + key.size() + walk(value);
  for (const TensorInfo &t : file->tensors()) {
    std::span<const uint8_t> bytes = file->tensorData(t);
    // Touch both ends: the bounds check must have covered them.
    if (!bytes.empty())
      sink = sink + bytes.front() + bytes.back();
    if (file->findTensor(t.name) != &t)
      __builtin_trap();
  }
  kiln::Expected<GGUFModel> model = GGUFModel::fromParts({*file});
  if (model)
    for (TensorRef ref : model->tensors())
      sink = sink + model->tensorData(ref).size();
  return 0;
}
