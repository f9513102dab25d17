//===- ValueFormat.cpp - Metadata values as JSON and as text
//---------------===//
#include "tool/Commands.h"

#include <fmt/core.h>

#include <cmath>

namespace kiln::gguf::tool {
namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 if there is none.
size_t utf8Length(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  size_t n = c < 0x80         ? 1
             : (c >> 5) == 6  ? 2
             : (c >> 4) == 14 ? 3
             : (c >> 3) == 30 ? 4
                              : 0;
  if (n == 0 || i + n > s.size())
    return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xc0) != 0x80)
      return 0;
  // Reject overlong forms and surrogates, as Python's decoder does.
  if (n == 2 && c < 0xc2)
    return 0;
  if (n == 3 &&
      ((c == 0xe0 && b(i + 1) < 0xa0) || (c == 0xed && b(i + 1) >= 0xa0)))
    return 0;
  if (n == 4 && ((c == 0xf0 && b(i + 1) < 0x90) || c > 0xf4 ||
                 (c == 0xf4 && b(i + 1) >= 0x90)))
    return 0;
  return n;
}

std::string jsonNumber(double v) {
  // Python's json module reads these spellings of non-finite values.
  if (std::isnan(v))
    return "NaN";
  if (std::isinf(v))
    return v > 0 ? "Infinity" : "-Infinity";
  // Shortest text that reads back as the same double; a float32 was widened
  // exactly, so it reads back as the same float too.
  std::string s = fmt::format("{}", v);
  return s;
}

std::string scalarJson(const Value &v) {
  switch (v.type()) {
  case ValueType::Bool:
    return *v.asBool() ? "true" : "false";
  case ValueType::Float32:
  case ValueType::Float64:
    return jsonNumber(*v.asFloat());
  case ValueType::String:
    return jsonString(*v.asString());
  case ValueType::Int8:
  case ValueType::Int16:
  case ValueType::Int32:
  case ValueType::Int64:
    return fmt::format("{}", *v.asInt());
  default:
    return fmt::format("{}", *v.asUInt());
  }
}

std::string scalarText(const Value &v, size_t maxString) {
  if (const std::string *s = v.asString()) {
    if (s->size() <= maxString)
      return jsonString(*s);
    return jsonString(s->substr(0, maxString)) +
           fmt::format("... ({} bytes)", s->size());
  }
  // People read a float32 as its shortest float spelling (0.1, not the
  // widened 0.10000000149011612 that JSON needs to be exact).
  if (v.type() == ValueType::Float32 && std::isfinite(*v.asFloat()))
    return fmt::format("{}", static_cast<float>(*v.asFloat()));
  return scalarJson(v);
}

} // namespace

std::string jsonString(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    size_t n = utf8Length(text, i);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(text.substr(i, n));
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += static_cast<char>(c);
    }
    i += n;
  }
  out += '"';
  return out;
}

std::string jsonValue(const Value &value) {
  std::string out =
      fmt::format("{{\"type\": \"{}\"", valueTypeName(value.type()));
  if (!value.isArray())
    return out + ", \"value\": " + scalarJson(value) + "}";
  out += fmt::format(", \"element_type\": \"{}\", \"value\": [",
                     valueTypeName(value.elementType()));
  bool first = true;
  for (const Value &e : value.elements()) {
    if (!first)
      out += ", ";
    first = false;
    out += e.isArray() ? jsonValue(e) : scalarJson(e);
  }
  return out + "]}";
}

std::string summarizeValue(const Value &value) {
  constexpr size_t kShownElements = 6;
  constexpr size_t kShownChars = 72;
  if (!value.isArray())
    return scalarText(value, kShownChars);
  const std::vector<Value> &elements = value.elements();
  std::string out = "[";
  for (size_t i = 0; i < elements.size() && i < kShownElements; ++i) {
    if (i)
      out += ", ";
    out += elements[i].isArray() ? summarizeValue(elements[i])
                                 : scalarText(elements[i], 24);
  }
  if (elements.size() > kShownElements)
    out += ", ...";
  out += "]";
  if (elements.size() > kShownElements)
    out += fmt::format(" ({} elements)", elements.size());
  return out;
}

int reportError(const Error &error) {
  fmt::print(stderr, "kiln-gguf: error: {}\n", error.message());
  return kExitBadInput;
}

int usageError(std::string_view command, std::string_view problem,
               std::string_view usage) {
  fmt::print(stderr, "kiln-gguf: error: {}: {}\n{}", command, problem, usage);
  return kExitUsage;
}

} // namespace kiln::gguf::tool
