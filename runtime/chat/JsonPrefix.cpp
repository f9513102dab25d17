//===- JsonPrefix.cpp - Whether bytes can still become a JSON text ---------===//
#include "chat/JsonPrefix.h"

#include "chat/ReplyText.h"

namespace kiln::chat {

namespace {

bool isSpace(uint8_t b) { return reply::isSpace(char(b)); }

/// Bytes a token may push at most for `accepts` to work on the shared stack
/// with a local overlay (longer ones take a whole copy).
constexpr size_t kOverlay = 64;

} // namespace

/// The recogniser's own stack (push and complete).
struct JsonPrefix::OwnStack {
  std::vector<uint8_t> &v;
  size_t size() const { return v.size(); }
  uint8_t top() const { return v.back(); }
  void pop() { v.pop_back(); }
  bool push(uint8_t c) {
    if (v.size() >= size_t(kMaxDepth))
      return false;
    v.push_back(c);
    return true;
  }
};

/// The stack as `accepts` sees it: the state's own below, read only, and
/// what the probed bytes opened above it.
struct JsonPrefix::OverlayStack {
  const std::vector<uint8_t> &base;
  size_t baseSize;
  uint8_t above[kOverlay];
  size_t n = 0;
  size_t size() const { return baseSize + n; }
  uint8_t top() const { return n ? above[n - 1] : base[baseSize - 1]; }
  void pop() {
    if (n)
      --n;
    else
      --baseSize;
  }
  bool push(uint8_t c) {
    if (size() >= size_t(kMaxDepth) || n == kOverlay)
      return false;
    above[n++] = c;
    return true;
  }
};

JsonPrefix::JsonPrefix(bool objectOnly) : objectOnly_(objectOnly) {}

template <class Stack>
bool JsonPrefix::startValue(Scalar &s, Stack &stack, uint8_t b,
                            bool topObjectOnly) {
  if (isSpace(b))
    return true;
  if (b == '{') {
    if (!stack.push('{'))
      return false;
    s.mode = Mode::ObjectFirst;
    return true;
  }
  if (topObjectOnly)
    return false;
  switch (b) {
  case '[':
    if (!stack.push('['))
      return false;
    s.mode = Mode::ArrayFirst;
    return true;
  case '"':
    s.mode = Mode::String;
    s.str = JsonString{};
    s.key = false;
    return true;
  case 't':
  case 'f':
  case 'n':
    s.mode = Mode::Literal;
    s.literal = b == 't' ? "true" : b == 'f' ? "false" : "null";
    s.count = 1;
    return true;
  default: // a number, or nothing
    s.mode = Mode::Number;
    s.number = JsonNumber::Start;
    return jsonNumberStep(s.number, b, false);
  }
}

template <class Stack>
bool JsonPrefix::afterValue(Scalar &s, Stack &stack, uint8_t b) {
  s.mode = Mode::After;
  if (isSpace(b))
    return true;
  if (stack.size() == 0)
    return false; // the text is whole: only whitespace may follow
  const bool array = stack.top() == '[';
  if (b == ',') {
    s.mode = array ? Mode::Value : Mode::Key;
    return true;
  }
  if (b == (array ? ']' : '}')) {
    stack.pop();
    return true;
  }
  return false;
}

template <class Stack>
bool JsonPrefix::step(Scalar &s, Stack &stack, uint8_t b, bool objectOnly) {
  switch (s.mode) {
  case Mode::Value:
    return startValue(s, stack, b, objectOnly && stack.size() == 0);
  case Mode::ArrayFirst:
    if (b == ']') {
      stack.pop();
      s.mode = Mode::After;
      return true;
    }
    return startValue(s, stack, b, false);
  case Mode::ObjectFirst:
  case Mode::Key:
    if (isSpace(b))
      return true;
    if (b == '}' && s.mode == Mode::ObjectFirst) {
      stack.pop();
      s.mode = Mode::After;
      return true;
    }
    if (b != '"')
      return false;
    s.mode = Mode::String;
    s.str = JsonString{};
    s.key = true;
    return true;
  case Mode::Colon:
    if (isSpace(b))
      return true;
    if (b != ':')
      return false;
    s.mode = Mode::Value;
    return true;
  case Mode::After:
    return afterValue(s, stack, b);
  case Mode::String:
    switch (jsonStringStep(s.str, b)) {
    case JsonStringByte::Refused:
      return false;
    case JsonStringByte::Closed:
      s.mode = s.key ? Mode::Colon : Mode::After;
      s.key = false;
      return true;
    default:
      return true;
    }
  case Mode::Number:
    // A byte the number cannot take ends it where it may end.
    if (jsonNumberStep(s.number, b, false))
      return true;
    return jsonNumberWhole(s.number) && afterValue(s, stack, b);
  case Mode::Literal:
    if (b != uint8_t(s.literal[s.count]))
      return false;
    if (s.literal[++s.count] == '\0')
      s.mode = Mode::After;
    return true;
  }
  return false;
}

bool JsonPrefix::push(std::string_view bytes) {
  Scalar s = scalar_;
  std::vector<uint8_t> stack = stack_;
  OwnStack own{stack};
  for (char c : bytes)
    if (!step(s, own, uint8_t(c), objectOnly_))
      return false;
  scalar_ = s;
  stack_ = std::move(stack);
  return true;
}

bool JsonPrefix::accepts(std::string_view bytes) const {
  if (bytes.size() > kOverlay) {
    JsonPrefix copy = *this;
    return copy.push(bytes);
  }
  Scalar s = scalar_;
  OverlayStack stack{stack_, stack_.size(), {}, 0};
  for (char c : bytes)
    if (!step(s, stack, uint8_t(c), objectOnly_))
      return false;
  return true;
}

std::string JsonPrefix::key() const {
  const Scalar &s = scalar_;
  const char literal = s.literal == nullptr ? '\0' : s.literal[0];
  std::string k = {char(objectOnly_), char(s.mode),      char(s.key),
                   char(s.str.mode),  char(s.str.count), char(s.str.lo),
                   char(s.str.hi),    char(s.count),     literal,
                   char(s.number)};
  k.append(stack_.begin(), stack_.end());
  return k;
}

bool JsonPrefix::complete() const {
  return stack_.empty() && scalar_.mode == Mode::After;
}

} // namespace kiln::chat
