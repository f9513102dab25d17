//===- GGUFValue.h - GGUF metadata values -----------------------*- C++ -*-===//
//
// The value of one GGUF metadata key: a scalar of one of the twelve GGUF
// scalar types, a string, or an array whose elements share one type (arrays
// of arrays are legal GGUF and kept as such). Shared by the reader, the
// writer and the synthesiser.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_GGUF_GGUFVALUE_H
#define KILN_GGUF_GGUFVALUE_H

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::gguf {

/// GGUF metadata value types as stored in the file.
enum class ValueType : uint32_t {
  UInt8 = 0,
  Int8 = 1,
  UInt16 = 2,
  Int16 = 3,
  UInt32 = 4,
  Int32 = 5,
  Float32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  UInt64 = 10,
  Int64 = 11,
  Float64 = 12,
};

/// "uint32" for ValueType::UInt32, "array" for ValueType::Array, ...
std::string_view valueTypeName(ValueType type);

/// True for the ids 0..12 defined above.
bool isValidValueType(uint32_t id);

/// Bytes one scalar of `type` takes in a file (1, 2, 4 or 8), or nullopt for
/// String and Array, whose size depends on their contents.
std::optional<uint64_t> scalarSize(ValueType type);

/// True for the eight integer types (not Bool).
bool isIntegerType(ValueType type);

/// One metadata value. Integers keep their exact stored type and bits;
/// accessors convert only when the conversion is exact.
class Value {
public:
  /// Integer scalars (any of the eight integer types) and bool.
  static Value unsignedInt(ValueType type, uint64_t bits);
  static Value signedInt(ValueType type, int64_t value);
  static Value u8(uint8_t v) { return unsignedInt(ValueType::UInt8, v); }
  static Value u32(uint32_t v) { return unsignedInt(ValueType::UInt32, v); }
  static Value u64(uint64_t v) { return unsignedInt(ValueType::UInt64, v); }
  static Value i32(int32_t v) { return signedInt(ValueType::Int32, v); }
  static Value i64(int64_t v) { return signedInt(ValueType::Int64, v); }
  static Value f32(float v);
  static Value f64(double v);
  static Value boolean(bool v);
  static Value string(std::string v);
  /// An array of `elementType`; every element must have that type.
  static Value array(ValueType elementType, std::vector<Value> elements);
  static Value stringArray(std::vector<std::string> strings);

  ValueType type() const { return type_; }
  bool isArray() const { return type_ == ValueType::Array; }

  /// The value as an unsigned integer if it is an integer type (or bool)
  /// holding a non-negative value.
  std::optional<uint64_t> asUInt() const;
  /// The value as a signed integer if it is an integer type that fits.
  std::optional<int64_t> asInt() const;
  /// The value of a Float32 or Float64 (or of an integer, converted).
  std::optional<double> asFloat() const;
  std::optional<bool> asBool() const;
  /// The string of a String value, or nullptr.
  const std::string *asString() const;

  /// Arrays: the element type and the elements (empty for scalars).
  ValueType elementType() const { return elementType_; }
  const std::vector<Value> &elements() const { return elements_; }

  bool operator==(const Value &other) const;

private:
  ValueType type_ = ValueType::UInt8;
  ValueType elementType_ = ValueType::UInt8; ///< Arrays only.
  uint64_t bits_ = 0;  ///< Integers (sign-extended) and bool.
  double real_ = 0.0;  ///< Float32 (exactly widened) and Float64.
  std::string string_; ///< String only.
  std::vector<Value> elements_;
};

/// Metadata in file order (GGUF keys are unique; order is kept for output).
using Metadata = std::vector<std::pair<std::string, Value>>;

} // namespace kiln::gguf

#endif // KILN_GGUF_GGUFVALUE_H
