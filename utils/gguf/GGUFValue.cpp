//===- GGUFValue.cpp - GGUF metadata values
//--------------------------------===//
#include "gguf/GGUFValue.h"

#include <cstring>
#include <limits>

namespace kiln::gguf {
namespace {

bool isSignedType(ValueType type) {
  return type == ValueType::Int8 || type == ValueType::Int16 ||
         type == ValueType::Int32 || type == ValueType::Int64;
}

// Reduces `bits` to what a value of `type` can hold, so that two values that
// would be written as the same bytes compare equal: unsigned types are
// truncated, signed types truncated and sign-extended, bool is 0 or 1.
uint64_t normalizeBits(ValueType type, uint64_t bits) {
  if (type == ValueType::Bool)
    return bits != 0;
  std::optional<uint64_t> size = scalarSize(type);
  if (!size || *size == 8)
    return bits;
  unsigned width = static_cast<unsigned>(*size * 8);
  uint64_t mask = (uint64_t(1) << width) - 1;
  bits &= mask;
  if (isSignedType(type) && (bits >> (width - 1)) & 1)
    bits |= ~mask;
  return bits;
}

} // namespace

std::string_view valueTypeName(ValueType type) {
  switch (type) {
  case ValueType::UInt8:
    return "uint8";
  case ValueType::Int8:
    return "int8";
  case ValueType::UInt16:
    return "uint16";
  case ValueType::Int16:
    return "int16";
  case ValueType::UInt32:
    return "uint32";
  case ValueType::Int32:
    return "int32";
  case ValueType::Float32:
    return "float32";
  case ValueType::Bool:
    return "bool";
  case ValueType::String:
    return "string";
  case ValueType::Array:
    return "array";
  case ValueType::UInt64:
    return "uint64";
  case ValueType::Int64:
    return "int64";
  case ValueType::Float64:
    return "float64";
  }
  return "invalid";
}

bool isValidValueType(uint32_t id) {
  return id <= static_cast<uint32_t>(ValueType::Float64);
}

std::optional<uint64_t> scalarSize(ValueType type) {
  switch (type) {
  case ValueType::UInt8:
  case ValueType::Int8:
  case ValueType::Bool:
    return 1;
  case ValueType::UInt16:
  case ValueType::Int16:
    return 2;
  case ValueType::UInt32:
  case ValueType::Int32:
  case ValueType::Float32:
    return 4;
  case ValueType::UInt64:
  case ValueType::Int64:
  case ValueType::Float64:
    return 8;
  case ValueType::String:
  case ValueType::Array:
    return std::nullopt;
  }
  return std::nullopt;
}

bool isIntegerType(ValueType type) {
  return scalarSize(type) && type != ValueType::Bool &&
         type != ValueType::Float32 && type != ValueType::Float64;
}

Value Value::unsignedInt(ValueType type, uint64_t bits) {
  Value v;
  v.type_ = type;
  v.bits_ = normalizeBits(type, bits);
  return v;
}

Value Value::signedInt(ValueType type, int64_t value) {
  return unsignedInt(type, static_cast<uint64_t>(value));
}

Value Value::f32(float v) {
  Value out;
  out.type_ = ValueType::Float32;
  out.real_ = v;
  return out;
}

Value Value::f64(double v) {
  Value out;
  out.type_ = ValueType::Float64;
  out.real_ = v;
  return out;
}

Value Value::boolean(bool v) { return unsignedInt(ValueType::Bool, v); }

Value Value::string(std::string v) {
  Value out;
  out.type_ = ValueType::String;
  out.string_ = std::move(v);
  return out;
}

Value Value::array(ValueType elementType, std::vector<Value> elements) {
  Value out;
  out.type_ = ValueType::Array;
  out.elementType_ = elementType;
  out.elements_ = std::move(elements);
  return out;
}

Value Value::stringArray(std::vector<std::string> strings) {
  std::vector<Value> elements;
  elements.reserve(strings.size());
  for (std::string &s : strings)
    elements.push_back(string(std::move(s)));
  return array(ValueType::String, std::move(elements));
}

std::optional<uint64_t> Value::asUInt() const {
  if (type_ == ValueType::Bool)
    return bits_;
  if (!isIntegerType(type_))
    return std::nullopt;
  if (isSignedType(type_) && static_cast<int64_t>(bits_) < 0)
    return std::nullopt;
  return bits_;
}

std::optional<int64_t> Value::asInt() const {
  if (type_ == ValueType::Bool)
    return static_cast<int64_t>(bits_);
  if (!isIntegerType(type_))
    return std::nullopt;
  if (!isSignedType(type_) &&
      bits_ > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return std::nullopt;
  return static_cast<int64_t>(bits_);
}

std::optional<double> Value::asFloat() const {
  if (type_ == ValueType::Float32 || type_ == ValueType::Float64)
    return real_;
  if (!isIntegerType(type_))
    return std::nullopt;
  if (isSignedType(type_))
    return static_cast<double>(static_cast<int64_t>(bits_));
  return static_cast<double>(bits_);
}

std::optional<bool> Value::asBool() const {
  if (type_ != ValueType::Bool)
    return std::nullopt;
  return bits_ != 0;
}

const std::string *Value::asString() const {
  return type_ == ValueType::String ? &string_ : nullptr;
}

bool Value::operator==(const Value &other) const {
  if (type_ != other.type_)
    return false;
  switch (type_) {
  case ValueType::Float32:
  case ValueType::Float64:
    // Bitwise, so that a NaN read back equals the NaN written.
    return std::memcmp(&real_, &other.real_, sizeof(double)) == 0;
  case ValueType::String:
    return string_ == other.string_;
  case ValueType::Array:
    return elementType_ == other.elementType_ && elements_ == other.elements_;
  default:
    return bits_ == other.bits_;
  }
}

} // namespace kiln::gguf
