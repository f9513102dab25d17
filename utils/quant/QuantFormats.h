//===- QuantFormats.h - Reference (de)quantisation of ggml blocks -*- C++ -*-===//
//
// Scalar, readable reference implementations: dequantisation bit-exact with
// gguf-py's `gguf.quants.dequantize` for every supported type, and
// quantisers (reasonable error, not llama.cpp's exact bits) for the types the
// synthesiser writes. Every other backend is checked against these.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_QUANT_QUANTFORMATS_H
#define KILN_QUANT_QUANTFORMATS_H

#include "quant/QuantTypes.h"
#include "support/Error.h"

#include <cstddef>
#include <cstdint>
#include <span>

namespace kiln {

/// Whether dequantize() supports `type`: F32, F16, BF16, Q4_0, Q4_1, Q5_0,
/// Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS.
bool canDequantize(GGMLType type);

/// Dequantises `out.size()` values (a multiple of the block size) from
/// `blocks`, which must hold exactly rowBytes(type, out.size()) bytes.
/// Errors (unsupported type, wrong sizes) name the type; the caller adds the
/// file and tensor.
Status dequantize(GGMLType type, std::span<const uint8_t> blocks,
                  std::span<float> out);

/// Whether quantize() supports `type` (at least F32, F16, BF16, Q8_0, Q4_K,
/// Q5_K, Q6_K).
bool canQuantize(GGMLType type);

/// Quantises `values` (a multiple of the block size) into `blocks`, which
/// must hold exactly rowBytes(type, values.size()) bytes.
Status quantize(GGMLType type, std::span<const float> values,
                std::span<uint8_t> blocks);

/// Whether every scale (the fp16 d, dmin fields) of the blocks in `blocks`
/// is finite; on failure `badBlock` is the index of the first bad block.
/// Plain float types check every value. Types without float scales pass.
bool blockScalesFinite(GGMLType type, std::span<const uint8_t> blocks,
                       uint64_t *badBlock = nullptr);

} // namespace kiln

#endif // KILN_QUANT_QUANTFORMATS_H
