//===- FloatFormats.h - Exact fp16 and bf16 conversions ---------*- C++ -*-===//
//
// Conversions between IEEE binary32 and the two 16-bit float formats GGUF
// files carry. They are written out bit by bit (no compiler builtins, no
// hardware F16C) so that every machine, every compiler and every build flag
// gives the same bits: gguf-py's numpy conversions are the reference.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_QUANT_FLOATFORMATS_H
#define KILN_QUANT_FLOATFORMATS_H

#include <cstdint>

namespace kiln {

/// The float32 value of IEEE binary16 bits `h`. Exact for every input:
/// subnormals become normal floats, infinities stay infinite, and a NaN keeps
/// its sign and payload (shifted into the top of the float mantissa, quiet
/// bit unchanged), as numpy's float16 -> float32 cast does.
float halfToFloat(uint16_t h);

/// The binary16 bits nearest to `f`, ties to even (IEEE default rounding):
/// values too large become infinity, values too small round to (signed)
/// zero or a subnormal. A NaN keeps its sign and the top 10 payload bits;
/// a payload that would vanish becomes 1 so the result stays NaN.
uint16_t floatToHalf(float f);

/// The float32 value of bfloat16 bits `b` (the high half of a float32).
float bf16ToFloat(uint16_t b);

/// The bfloat16 bits nearest to `f`, ties to even; a NaN is made quiet
/// (as ggml and gguf-py do) so truncation can never turn it into infinity.
uint16_t floatToBf16(float f);

/// The bits of a float, and the float of some bits.
uint32_t floatBits(float f);
float floatFromBits(uint32_t bits);

} // namespace kiln

#endif // KILN_QUANT_FLOATFORMATS_H
