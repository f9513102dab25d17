//===- QuantTypes.cpp - The ggml type table --------------------------------===//
#include "quant/QuantTypes.h"

#include "support/CheckedMath.h"

#include <array>
#include <cctype>

namespace kiln {
namespace {

// Block geometry as in ggml's type traits (checked against gguf-py's
// GGML_QUANT_SIZES by test/python/test_quant_types.py).
constexpr std::array<GGMLTypeTraits, 34> kTypes = {{
    {GGMLType::F32, "F32", 1, 4},
    {GGMLType::F16, "F16", 1, 2},
    {GGMLType::Q4_0, "Q4_0", 32, 18},
    {GGMLType::Q4_1, "Q4_1", 32, 20},
    {GGMLType::Q5_0, "Q5_0", 32, 22},
    {GGMLType::Q5_1, "Q5_1", 32, 24},
    {GGMLType::Q8_0, "Q8_0", 32, 34},
    {GGMLType::Q8_1, "Q8_1", 32, 40},
    {GGMLType::Q2_K, "Q2_K", 256, 84},
    {GGMLType::Q3_K, "Q3_K", 256, 110},
    {GGMLType::Q4_K, "Q4_K", 256, 144},
    {GGMLType::Q5_K, "Q5_K", 256, 176},
    {GGMLType::Q6_K, "Q6_K", 256, 210},
    {GGMLType::Q8_K, "Q8_K", 256, 292},
    {GGMLType::IQ2_XXS, "IQ2_XXS", 256, 66},
    {GGMLType::IQ2_XS, "IQ2_XS", 256, 74},
    {GGMLType::IQ3_XXS, "IQ3_XXS", 256, 98},
    {GGMLType::IQ1_S, "IQ1_S", 256, 50},
    {GGMLType::IQ4_NL, "IQ4_NL", 32, 18},
    {GGMLType::IQ3_S, "IQ3_S", 256, 110},
    {GGMLType::IQ2_S, "IQ2_S", 256, 82},
    {GGMLType::IQ4_XS, "IQ4_XS", 256, 136},
    {GGMLType::I8, "I8", 1, 1},
    {GGMLType::I16, "I16", 1, 2},
    {GGMLType::I32, "I32", 1, 4},
    {GGMLType::I64, "I64", 1, 8},
    {GGMLType::F64, "F64", 1, 8},
    {GGMLType::IQ1_M, "IQ1_M", 256, 56},
    {GGMLType::BF16, "BF16", 1, 2},
    {GGMLType::TQ1_0, "TQ1_0", 256, 54},
    {GGMLType::TQ2_0, "TQ2_0", 256, 66},
    {GGMLType::MXFP4, "MXFP4", 32, 17},
    {GGMLType::NVFP4, "NVFP4", 64, 36},
    {GGMLType::Q1_0, "Q1_0", 128, 18},
}};

} // namespace

std::optional<GGMLTypeTraits> lookupGGMLType(uint32_t id) {
  for (const GGMLTypeTraits &t : kTypes)
    if (static_cast<uint32_t>(t.type) == id)
      return t;
  return std::nullopt;
}

const GGMLTypeTraits &traitsOf(GGMLType type) {
  for (const GGMLTypeTraits &t : kTypes)
    if (t.type == type)
      return t;
  // Every enumerator is in the table; reaching here is a programming error.
  __builtin_unreachable();
}

std::string_view nameOf(GGMLType type) { return traitsOf(type).name; }

std::optional<GGMLType> parseGGMLType(std::string_view name) {
  for (const GGMLTypeTraits &t : kTypes) {
    if (t.name.size() != name.size())
      continue;
    bool same = true;
    for (size_t i = 0; i < name.size() && same; ++i)
      same = std::toupper(static_cast<unsigned char>(name[i])) == t.name[i];
    if (same)
      return t.type;
  }
  return std::nullopt;
}

std::optional<uint64_t> rowBytes(GGMLType type, uint64_t n) {
  const GGMLTypeTraits &t = traitsOf(type);
  if (n % t.blockSize != 0)
    return std::nullopt;
  return checkedMul(n / t.blockSize, t.blockBytes);
}

} // namespace kiln
