//===- JsonValue.cpp - JSON documents as template values ------------------===//
#include "chat/JsonValue.h"

#include "chat/ChatTemplate.h"
#include "chat/JsonParse.h"
#include "chat/JsonString.h"

#include <cstdint>
#include <limits>

namespace kiln::chat {
namespace {

Expected<Value> convert(const nlohmann::ordered_json &json, const std::string &where,
                        const std::string &pointer, uint32_t depth) {
  using Type = nlohmann::ordered_json::value_t;
  const std::string field = pointer.empty() ? "/" : pointer;
  switch (json.type()) {
  case Type::null:
    return Value::none();
  case Type::boolean:
    return Value::boolean(json.get<bool>());
  case Type::number_integer:
    return Value::integer(json.get<int64_t>());
  case Type::number_unsigned: {
    const auto value = json.get<uint64_t>();
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return Error(where, field, "integer too large (Kiln's integers are 64-bit)");
    return Value::integer(static_cast<int64_t>(value));
  }
  case Type::number_float:
    return Value::number(json.get<double>());
  case Type::string:
    return Value(json.get_ref<const std::string &>());
  case Type::array:
  case Type::object: {
    if (depth >= kMaxNestingDepth)
      return Error(where, field, "nested too deeply (limit " +
                                     std::to_string(kMaxNestingDepth) + ")");
    if (json.is_array()) {
      ValueList items;
      items.reserve(json.size());
      size_t index = 0;
      for (const auto &item : json) {
        Expected<Value> value =
            convert(item, where, pointer + "/" + std::to_string(index++), depth + 1);
        if (!value)
          return value.error();
        items.push_back(std::move(*value));
      }
      return Value::list(std::move(items));
    }
    ValueMap map;
    for (const auto &[key, item] : json.items()) {
      Expected<Value> value = convert(
          item, where, pointer + "/" + jsonPointerToken(key), depth + 1);
      if (!value)
        return value.error();
      map.set(key, std::move(*value));
    }
    return Value::map(std::move(map));
  }
  case Type::binary:
  case Type::discarded:
    break;
  }
  return Error(where, field, "not a JSON value");
}

} // namespace

Expected<Value> valueFromJson(const nlohmann::ordered_json &json,
                              const std::string &where) {
  return convert(json, where, "", 0);
}

Expected<Value> parseJsonValue(std::string_view text, const std::string &where) {
  nlohmann::ordered_json json;
  try {
    json = parseOrderedJson(text);
  } catch (const JsonTooDeep &e) {
    return Error(where, "", e.what());
  } catch (const nlohmann::ordered_json::exception &e) {
    return Error(where, "", std::string("invalid JSON: ") + e.what());
  }
  return valueFromJson(json, where);
}

} // namespace kiln::chat
