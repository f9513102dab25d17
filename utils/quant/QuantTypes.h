//===- QuantTypes.h - GGML tensor types and their block geometry -*- C++ -*-===//
//
// The ggml type ids that GGUF files carry, with each type's block size
// (values per block) and block bytes. This table is what every size check in
// the GGUF reader, the weight binder and the partitioner is computed from;
// whether a type can also be dequantised is a separate question answered by
// the quant format library.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_QUANT_QUANTTYPES_H
#define KILN_QUANT_QUANTTYPES_H

#include "support/Error.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

/// ggml type ids as stored in GGUF tensor infos (ids that ggml retired are
/// absent and are rejected as unknown).
enum class GGMLType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
};

/// Geometry of one ggml type: `blockSize` values are stored in `blockBytes`
/// bytes; a row of n values (n a multiple of blockSize) takes
/// n / blockSize * blockBytes bytes.
struct GGMLTypeTraits {
  GGMLType type;
  std::string_view name; ///< As llama.cpp and gguf-py spell it, e.g. "Q4_K".
  uint32_t blockSize;
  uint32_t blockBytes;
};

/// The traits of a raw type id read from a file, or nullopt for ids that are
/// not (or no longer) ggml types.
std::optional<GGMLTypeTraits> lookupGGMLType(uint32_t id);

/// The traits of a known type.
const GGMLTypeTraits &traitsOf(GGMLType type);

/// "Q4_K" for GGMLType::Q4_K.
std::string_view nameOf(GGMLType type);

/// The type named `name` (case-insensitive, e.g. "q4_k" or "Q4_K").
std::optional<GGMLType> parseGGMLType(std::string_view name);

/// Bytes of a row of `n` values: nullopt unless n is a multiple of the block
/// size (the caller names the tensor in its own error).
std::optional<uint64_t> rowBytes(GGMLType type, uint64_t n);

} // namespace kiln

#endif // KILN_QUANT_QUANTTYPES_H
