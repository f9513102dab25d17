//===- ToolCallPrefix.cpp - A reply that must call a tool ------------------===//
#include "chat/ToolCallPrefix.h"

#include "chat/JsonString.h"
#include "chat/ReplyText.h"

#include <algorithm>

namespace kiln::chat {

namespace {

constexpr const char *kOpen = "<tool_call>";
constexpr const char *kKeyTail = "</arg_key>\n<arg_value>";
constexpr const char *kValueEnd = "</arg_value>";
constexpr const char *kNewline = "\n";
/// After a typed value, whose end its '<' began.
constexpr const char *kValueTail = "</arg_value>\n";

/// The literal's index for key() (0: none).
char literalIndex(const char *literal) {
  for (char i = 0; const char *l : {kOpen, kKeyTail, kNewline, kValueTail}) {
    ++i;
    if (literal == l)
      return i;
  }
  return 0;
}
/// What may follow a name or a value's newline: another key, or the end.
constexpr const char *kChoices[2] = {"<arg_key>", "</tool_call>"};
/// What a value may not hold: the reader (ToolCalls.h) ends a call at the
/// first "</tool_call>" and a value at the first "</arg_value>", whatever
/// they are inside.
constexpr const char *kCallEnd = "</tool_call>";

/// Moves `at`, the bytes of `marker` matched so far, past `b`; false when
/// `b` completes the marker. Neither marker has a border but its '<', so a
/// mismatch restarts the match at this byte.
bool avoid(uint32_t &at, const char *marker, uint8_t b) {
  if (b == uint8_t(marker[at])) {
    if (marker[++at] == '\0')
      return false;
  } else {
    at = b == '<' ? 1 : 0;
  }
  return true;
}

bool isSpace(uint8_t b) { return reply::isSpace(char(b)); }

/// Byte `at` of `head` then `tail` (0 past both).
char charAt(const std::string &head, const char *tail, uint32_t at) {
  if (at < head.size())
    return head[at];
  return tail[at - head.size()];
}

/// In a set of candidates `head(k) + tail`, keeps those whose byte `at` is
/// `b`; returns the first that is then whole (or -1), and whether any is
/// left. `at` moves past the byte.
template <class Head>
int narrow(std::bitset<ToolCallPrefix::kMaxChoices> &alive, uint32_t &at,
           uint8_t b, size_t count, const char *tail, Head head,
           bool &any) {
  any = false;
  int whole = -1;
  for (size_t k = 0; k < count; ++k) {
    if (!alive[k])
      continue;
    const std::string &h = head(k);
    if (uint8_t(charAt(h, tail, at)) != b || charAt(h, tail, at) == '\0') {
      alive[k] = false;
      continue;
    }
    any = true;
    if (whole < 0 && charAt(h, tail, at + 1) == '\0')
      whole = int(k);
  }
  ++at;
  return whole;
}

} // namespace

ToolCallPrefix::ToolCallPrefix(std::vector<ToolSignature> tools, bool several)
    : tools_(std::make_shared<const std::vector<ToolSignature>>(
          std::move(tools))),
      several_(several) {}

bool ToolCallPrefix::step(State &s, uint8_t b) const {
  const std::vector<ToolSignature> &tools = *tools_;
  switch (s.phase) {
  case Phase::Lead:
  case Phase::Done:
    if (isSpace(b)) { // at counts the run: at most kWhitespaceRun
      if (s.at >= reply::kWhitespaceRun)
        return false;
      ++s.at;
      return true;
    }
    if (b != '<' || (s.phase == Phase::Done && !several_))
      return false;
    s.phase = Phase::Literal;
    s.literal = kOpen;
    s.at = 1;
    return true;
  case Phase::Literal:
    if (b != uint8_t(s.literal[s.at]))
      return false;
    if (s.literal[++s.at] != '\0')
      return true;
    if (s.literal == kOpen) {
      s.phase = Phase::Name;
      s.alive.reset();
      for (size_t k = 0; k < tools.size() && k < kMaxChoices; ++k)
        s.alive[k] = true;
    } else if (s.literal == kKeyTail) {
      s.phase = Phase::Value; // a key not in a list: any value
    } else { // the newline after a value, or a typed value's tail
      openChoice(s);
    }
    s.at = 0;
    return true;
  case Phase::Choice: {
    bool any = false;
    static const std::string choices[2] = {kChoices[0], kChoices[1]};
    const int whole = narrow(s.alive, s.at, b, 2, "",
                             [](size_t k) -> const std::string & {
                               return choices[k];
                             },
                             any);
    if (!any)
      return false;
    if (whole == 1) {
      s.phase = Phase::Done;
      s.at = 0;
    } else if (whole == 0) {
      const std::vector<std::string> &params = tools[s.function].parameters;
      s.phase = params.empty() ? Phase::FreeKey : Phase::Key;
      s.alive.reset();
      for (size_t k = 0; k < params.size() && k < kMaxChoices; ++k)
        s.alive[k] = !s.seen[k];
    } else {
      return true;
    }
    s.at = 0;
    return true;
  }
  case Phase::Name: {
    bool any = false;
    const int whole = narrow(s.alive, s.at, b, tools.size(), kNewline,
                             [&](size_t k) -> const std::string & {
                               return tools[k].name;
                             },
                             any);
    if (!any)
      return false;
    if (whole >= 0) {
      s.function = uint32_t(whole);
      s.seen.reset();
      openChoice(s);
    }
    return true;
  }
  case Phase::Key: {
    const std::vector<std::string> &params = tools[s.function].parameters;
    bool any = false;
    const int whole = narrow(s.alive, s.at, b, params.size(), kKeyTail,
                             [&](size_t k) -> const std::string & {
                               return params[k];
                             },
                             any);
    if (!any)
      return false;
    if (whole >= 0) {
      const std::vector<std::shared_ptr<const JsonSchema>> &values =
          tools[s.function].values;
      s.seen[size_t(whole)] = true;
      if (size_t(whole) < values.size() && values[size_t(whole)]) {
        s.phase = Phase::Typed;
        s.value.emplace(values[size_t(whole)]);
      } else {
        s.phase = Phase::Value;
      }
      s.at = 0;
    }
    return true;
  }
  case Phase::Typed:
    // A whole value ends at the '<' of "</arg_value>" (JSON has '<' only
    // inside a string, where the value is not whole).
    if (b == '<' && !s.value->accepts("<")) {
      if (!s.value->complete())
        return false;
      s.value.reset();
      s.phase = Phase::Literal;
      s.literal = kValueTail;
      s.at = 1;
      s.closeAt = 0;
      return true;
    }
    // Inside a string, neither marker (the reader would end the value or
    // the call there).
    if (!avoid(s.at, kValueEnd, b) || !avoid(s.closeAt, kCallEnd, b))
      return false;
    return s.value->take(b);
  case Phase::FreeKey:
    if (b == '\n')
      return false;
    if (b == '<') {
      s.phase = Phase::Literal;
      s.literal = kKeyTail;
      s.at = 1;
    }
    return true;
  case Phase::Value:
    // Any bytes up to "</arg_value>", but never "</tool_call>".
    if (!avoid(s.closeAt, kCallEnd, b))
      return false;
    if (!avoid(s.at, kValueEnd, b)) {
      s.phase = Phase::Literal;
      s.literal = kNewline;
      s.at = 0;
      s.closeAt = 0;
    }
    return true;
  }
  return false;
}

bool ToolCallPrefix::run(State &s, std::string_view bytes) const {
  for (char c : bytes)
    if (!step(s, uint8_t(c)))
      return false;
  return true;
}

bool ToolCallPrefix::acceptsControl(std::string_view bytes) const {
  static constexpr std::string_view kMarkers[] = {
      "<tool_call>", "</tool_call>", "<arg_key>",
      "</arg_key>",  "<arg_value>",  "</arg_value>"};
  if (std::find(std::begin(kMarkers), std::end(kMarkers), bytes) ==
      std::end(kMarkers))
    return false;
  State s = state_;
  if (!run(s, bytes))
    return false;
  // Names and keys hold no '<': there a marker is markup. Inside a value it
  // must end the value, not be its text.
  return (state_.phase != Phase::Value && state_.phase != Phase::Typed) ||
         s.phase != state_.phase;
}

bool ToolCallPrefix::accepts(std::string_view bytes) const {
  // Inside a JSON value, bytes the value takes whole are taken (a '<' the
  // value takes is inside one of its strings), and without a '<' nothing
  // else can take them: the value's own accepts answers (with its
  // shortcuts) without a copy of the state. Bytes with a '>' may complete
  // a marker a string may not hold, so they take the whole way.
  if (state_.phase == Phase::Typed &&
      bytes.find('>') == std::string_view::npos) {
    if (state_.value->accepts(bytes))
      return true;
    if (bytes.find('<') == std::string_view::npos)
      return false;
  }
  State s = state_;
  return run(s, bytes);
}

bool ToolCallPrefix::push(std::string_view bytes) {
  State s = state_;
  if (!run(s, bytes))
    return false;
  state_ = s;
  return true;
}

void ToolCallPrefix::openChoice(State &s) const {
  const ToolSignature &tool = (*tools_)[s.function];
  bool more = tool.parameters.empty(), done = true;
  for (size_t k = 0; k < tool.parameters.size() && k < kMaxChoices; ++k) {
    more = more || !s.seen[k];
    if (k < tool.required.size() && tool.required[k])
      done = done && s.seen[k];
  }
  s.phase = Phase::Choice;
  s.alive.reset();
  s.alive[0] = more;
  s.alive[1] = done;
  s.at = 0;
}

namespace {

/// Whether `type` names one JSON type other than string (a value the
/// markup's reader turns into JSON).
bool jsonValueType(std::string_view type) {
  static constexpr std::string_view kTypes[] = {"null",   "boolean", "integer",
                                                "number", "array",   "object"};
  return std::find(std::begin(kTypes), std::end(kTypes), type) !=
         std::end(kTypes);
}

} // namespace

std::shared_ptr<const JsonSchema> typeSchema(std::string_view type) {
  if (!jsonValueType(type))
    return nullptr;
  ValueMap m;
  m.set("type", Value(std::string(type)));
  Expected<std::shared_ptr<const JsonSchema>> s =
      JsonSchema::compile(Value::map(std::move(m)), "type");
  return s ? *s : nullptr;
}

std::shared_ptr<const JsonSchema> parameterValues(const Value &parameters,
                                                  const std::string &name) {
  const Value *properties =
      parameters.isMap() ? parameters.asMap().find("properties") : nullptr;
  const Value *schema = properties && properties->isMap()
                            ? properties->asMap().find(name)
                            : nullptr;
  const Value *type =
      schema && schema->isMap() ? schema->asMap().find("type") : nullptr;
  if (!type || !type->isString() || !jsonValueType(type->asString()))
    return nullptr; // a string, or not one type: any text
  Expected<std::shared_ptr<const JsonSchema>> own = JsonSchema::compile(
      parameters, "parameters", "/properties/" + jsonPointerToken(name));
  return own ? *own : typeSchema(type->asString());
}

Expected<ToolSignature> toolSignature(std::string name,
                                      const Value &parameters) {
  ToolSignature sig{std::move(name), {}, {}, {}};
  const Value *properties =
      parameters.isMap() ? parameters.asMap().find("properties") : nullptr;
  if (!properties || !properties->isMap())
    return sig;
  const Value *required = parameters.asMap().find("required");
  for (const auto &[key, schema] : properties->asMap()) {
    if (!writableInMarkup(key))
      return Error(sig.name, key, "cannot be written in GLM's call markup");
    bool must = false;
    if (required && required->isList())
      for (const Value &r : required->asList())
        must = must || (r.isString() && r.asString() == key);
    sig.parameters.push_back(key);
    sig.values.push_back(parameterValues(parameters, key));
    sig.required.push_back(must);
  }
  return sig;
}

bool writableInMarkup(std::string_view name) {
  return !name.empty() && name.find_first_of("<\n") == std::string_view::npos &&
         !reply::isSpace(name.front()) && !reply::isSpace(name.back());
}

std::string ToolCallPrefix::key() const {
  const State &s = state_;
  std::string k = {char(s.phase), literalIndex(s.literal)};
  k.append(reinterpret_cast<const char *>(&s.at), sizeof s.at);
  k.append(reinterpret_cast<const char *>(&s.closeAt), sizeof s.closeAt);
  k.append(reinterpret_cast<const char *>(&s.function), sizeof s.function);
  k += s.alive.to_string();
  k += s.seen.to_string();
  if (s.value)
    k += s.value->key();
  return k;
}

bool ToolCallPrefix::complete() const { return state_.phase == Phase::Done; }

bool ToolCallPrefix::final() const { return complete() && !several_; }

} // namespace kiln::chat
