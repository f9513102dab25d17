//===- CheckedMath.h - Overflow-checked size arithmetic --------*- C++ -*-===//
//
// Sizes and offsets read from untrusted files (GGUF, artifacts) are combined
// only through these helpers, which report overflow instead of wrapping.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_SUPPORT_CHECKEDMATH_H
#define KILN_SUPPORT_CHECKEDMATH_H

#include <cstdint>
#include <optional>

namespace kiln {

/// a + b, or nullopt if it does not fit in 64 bits.
inline std::optional<uint64_t> checkedAdd(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r))
    return std::nullopt;
  return r;
}

/// a * b, or nullopt if it does not fit in 64 bits.
inline std::optional<uint64_t> checkedMul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    return std::nullopt;
  return r;
}

/// The smallest multiple of `align` (> 0) not below `value`, or nullopt on
/// overflow.
inline std::optional<uint64_t> checkedAlignUp(uint64_t value, uint64_t align) {
  uint64_t rem = value % align;
  if (rem == 0)
    return value;
  return checkedAdd(value, align - rem);
}

} // namespace kiln

#endif // KILN_SUPPORT_CHECKEDMATH_H
