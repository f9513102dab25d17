//===- QuantFormats.cpp - Size checks, dispatch to codecs -----------------===//
#include "quant/QuantFormats.h"

#include "quant/BlockCodecs.h"

#include <cmath>
#include <fmt/format.h>
#include <string>

namespace kiln {
namespace {
using namespace codecs;

/// Where a block's float scale fields are and how they are encoded.
enum class ScaleKind : uint8_t { None, F16, BF16, F32 };

struct Codec {
  GGMLType type;
  DequantFn dequant; ///< Null if Kiln cannot read the type.
  QuantFn quant;     ///< Null if Kiln cannot write the type.
  ScaleKind scaleKind;
  int16_t scaleOffsets[2]; ///< Byte offsets of the scale fields, -1 = none.
};

// Also lists types Kiln cannot (de)quantise whose scale layout is simple
// (an fp16 d at a fixed offset), so blockScalesFinite() still checks them.
// Layouts with packed or 8-bit-float scales (IQ1_M, MXFP4, NVFP4, Q1_0) are
// left out and pass.
constexpr Codec kCodecs[] = {
    {GGMLType::F32, dequantF32, quantF32, ScaleKind::F32, {0, -1}},
    {GGMLType::F16, dequantF16, quantF16, ScaleKind::F16, {0, -1}},
    {GGMLType::BF16, dequantBF16, quantBF16, ScaleKind::BF16, {0, -1}},
    {GGMLType::Q4_0, dequantQ4_0, quantQ4_0, ScaleKind::F16, {0, -1}},
    {GGMLType::Q4_1, dequantQ4_1, quantQ4_1, ScaleKind::F16, {0, 2}},
    {GGMLType::Q5_0, dequantQ5_0, quantQ5_0, ScaleKind::F16, {0, -1}},
    {GGMLType::Q5_1, dequantQ5_1, quantQ5_1, ScaleKind::F16, {0, 2}},
    {GGMLType::Q8_0, dequantQ8_0, quantQ8_0, ScaleKind::F16, {0, -1}},
    {GGMLType::Q2_K, dequantQ2_K, quantQ2_K, ScaleKind::F16, {80, 82}},
    {GGMLType::Q3_K, dequantQ3_K, quantQ3_K, ScaleKind::F16, {108, -1}},
    {GGMLType::Q4_K, dequantQ4_K, quantQ4_K, ScaleKind::F16, {0, 2}},
    {GGMLType::Q5_K, dequantQ5_K, quantQ5_K, ScaleKind::F16, {0, 2}},
    {GGMLType::Q6_K, dequantQ6_K, quantQ6_K, ScaleKind::F16, {208, -1}},
    {GGMLType::IQ4_NL, dequantIQ4_NL, quantIQ4_NL, ScaleKind::F16, {0, -1}},
    {GGMLType::IQ4_XS, dequantIQ4_XS, quantIQ4_XS, ScaleKind::F16, {0, -1}},
    // Scale layouts only.
    {GGMLType::Q8_1, nullptr, nullptr, ScaleKind::F16, {0, 2}},
    {GGMLType::Q8_K, nullptr, nullptr, ScaleKind::F32, {0, -1}},
    {GGMLType::IQ2_XXS, nullptr, nullptr, ScaleKind::F16, {0, -1}},
    {GGMLType::IQ2_XS, nullptr, nullptr, ScaleKind::F16, {0, -1}},
    {GGMLType::IQ2_S, nullptr, nullptr, ScaleKind::F16, {0, -1}},
    {GGMLType::IQ3_XXS, nullptr, nullptr, ScaleKind::F16, {0, -1}},
    {GGMLType::IQ3_S, nullptr, nullptr, ScaleKind::F16, {0, -1}},
    {GGMLType::IQ1_S, nullptr, nullptr, ScaleKind::F16, {0, -1}},
    {GGMLType::TQ1_0, nullptr, nullptr, ScaleKind::F16, {52, -1}},
    {GGMLType::TQ2_0, nullptr, nullptr, ScaleKind::F16, {64, -1}},
};

const Codec *findCodec(GGMLType type) {
  for (const Codec &c : kCodecs)
    if (c.type == type)
      return &c;
  return nullptr;
}

Error formatError(GGMLType type, std::string problem) {
  return Error("", "", fmt::format("{}: {}", nameOf(type), problem));
}

/// Checks that `values` values and `bytes` bytes are whole blocks of the
/// same count.
Status checkSizes(GGMLType type, uint64_t values, uint64_t bytes) {
  const GGMLTypeTraits &t = traitsOf(type);
  std::optional<uint64_t> expected = rowBytes(type, values);
  if (!expected)
    return formatError(type, fmt::format("{} values is not a multiple of the "
                                         "block size {}",
                                         values, t.blockSize));
  if (*expected != bytes)
    return formatError(type, fmt::format("{} values take {} bytes, got {}",
                                         values, *expected, bytes));
  return Status::ok();
}

bool isBlockQuant(GGMLType type) { return traitsOf(type).blockSize > 1; }
} // namespace

bool canDequantize(GGMLType type) {
  const Codec *c = findCodec(type);
  return c && c->dequant;
}

bool canQuantize(GGMLType type) {
  const Codec *c = findCodec(type);
  return c && c->quant;
}

Status dequantize(GGMLType type, std::span<const uint8_t> blocks,
                  std::span<float> out) {
  if (!canDequantize(type))
    return Error("", "", fmt::format("unsupported type {}", nameOf(type)));
  if (Status s = checkSizes(type, out.size(), blocks.size()); !s)
    return s;
  const GGMLTypeTraits &t = traitsOf(type);
  DequantFn fn = findCodec(type)->dequant;
  for (size_t b = 0, n = out.size() / t.blockSize; b < n; ++b)
    fn(blocks.data() + b * t.blockBytes, out.data() + b * t.blockSize);
  return Status::ok();
}

Status quantize(GGMLType type, std::span<const float> values,
                std::span<uint8_t> blocks) {
  if (!canQuantize(type))
    return Error(
        "", "",
        fmt::format("unsupported type {} for quantisation", nameOf(type)));
  if (Status s = checkSizes(type, values.size(), blocks.size()); !s)
    return s;
  // Plain float types convert infinities and NaNs like any other value; a
  // block type would have to fold them into a scale, so they are refused.
  if (isBlockQuant(type))
    for (size_t i = 0; i < values.size(); ++i)
      if (!std::isfinite(values[i]))
        return formatError(type,
                           fmt::format("value {} is not finite ({}); block "
                                       "types hold finite values only",
                                       i, values[i]));
  const GGMLTypeTraits &t = traitsOf(type);
  QuantFn fn = findCodec(type)->quant;
  for (size_t b = 0, n = values.size() / t.blockSize; b < n; ++b)
    fn(values.data() + b * t.blockSize, blocks.data() + b * t.blockBytes);
  return Status::ok();
}

bool blockScalesFinite(GGMLType type, std::span<const uint8_t> blocks,
                       uint64_t *badBlock) {
  const Codec *c = findCodec(type);
  if (!c || c->scaleKind == ScaleKind::None)
    return true;
  const GGMLTypeTraits &t = traitsOf(type);
  // A trailing partial block is not a block; size checks report it.
  for (uint64_t b = 0, n = blocks.size() / t.blockBytes; b < n; ++b) {
    const uint8_t *block = blocks.data() + b * t.blockBytes;
    for (int16_t offset : c->scaleOffsets) {
      if (offset < 0)
        continue;
      const uint8_t *p = block + offset;
      float v = c->scaleKind == ScaleKind::F16    ? halfToFloat(loadU16(p))
                : c->scaleKind == ScaleKind::BF16 ? bf16ToFloat(loadU16(p))
                                                  : floatFromBits(loadU32(p));
      if (!std::isfinite(v)) {
        if (badBlock)
          *badBlock = b;
        return false;
      }
    }
  }
  return true;
}

} // namespace kiln
