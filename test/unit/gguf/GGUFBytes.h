//===- GGUFBytes.h - Hand-built GGUF images for reader tests ----*- C++ -*-===//
//
// Builds GGUF bytes field by field, so tests can produce exactly the
// malformed layouts the writer refuses to write.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TEST_UNIT_GGUF_GGUFBYTES_H
#define KILN_TEST_UNIT_GGUF_GGUFBYTES_H

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace kiln::gguf::test {

class Bytes {
public:
  template <typename T> Bytes &put(T v) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    data.insert(data.end(), raw, raw + sizeof(T));
    return *this;
  }
  Bytes &u32(uint32_t v) { return put(v); }
  Bytes &u64(uint64_t v) { return put(v); }
  Bytes &str(std::string_view s) {
    u64(s.size());
    data.insert(data.end(), s.begin(), s.end());
    return *this;
  }
  /// "GGUF", version, tensor count, KV count.
  Bytes &header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    data.insert(data.end(), {'G', 'G', 'U', 'F'});
    return u32(version).u64(tensors).u64(kvs);
  }
  /// A uint32 KV.
  Bytes &kvU32(std::string_view key, uint32_t v) {
    return str(key).u32(4).u32(v);
  }
  /// A tensor info.
  Bytes &tensor(std::string_view name, std::vector<uint64_t> dims,
                uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims)
      u64(d);
    return u32(type).u64(offset);
  }
  /// Zero bytes up to a multiple of `align`, then `n` more.
  Bytes &padTo(uint64_t align, uint64_t n = 0) {
    while (data.size() % align)
      data.push_back(0);
    data.resize(data.size() + n, 0);
    return *this;
  }

  std::vector<uint8_t> data;
};

} // namespace kiln::gguf::test

#endif // KILN_TEST_UNIT_GGUF_GGUFBYTES_H
