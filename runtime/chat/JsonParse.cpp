//===- JsonParse.cpp - JSON text to ordered_json in linear time -----------===//
#include "chat/JsonParse.h"

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::chat {

JsonTooDeep::JsonTooDeep()
    : exception(0, ("arrays and objects nested too deeply (limit " +
                    std::to_string(kMaxNestingDepth) + ")")
                       .c_str()) {}

namespace {

using Json = nlohmann::ordered_json;

/// nlohmann's SAX events into a document. Each open array or object is a
/// frame; a finished value goes into the innermost frame (an object's under
/// the key read last) or becomes the document.
class Builder {
public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  bool null() { return put(Json(nullptr)); }
  bool boolean(bool v) { return put(Json(v)); }
  bool number_integer(number_integer_t v) { return put(Json(v)); }
  bool number_unsigned(number_unsigned_t v) { return put(Json(v)); }
  bool number_float(number_float_t v, const string_t &) { return put(Json(v)); }
  bool string(string_t &v) { return put(Json(std::move(v))); }
  bool binary(binary_t &v) { return put(Json::binary(std::move(v))); }
  bool start_object(std::size_t) { return open(Json::object()); }
  bool key(string_t &k) {
    frames_.back().key = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string &,
                   const nlohmann::detail::exception &e) {
    throw e;
  }

  Json take() { return std::move(root_); }

private:
  struct Frame {
    Json value;
    std::string key;                              ///< an object's next key
    std::unordered_map<std::string, size_t> keys; ///< an object's, by place
  };

  bool put(Json v) {
    if (frames_.empty()) {
      root_ = std::move(v);
      return true;
    }
    Frame &f = frames_.back();
    if (f.value.is_array()) {
      f.value.get_ref<Json::array_t &>().push_back(std::move(v));
      return true;
    }
    // ordered_map is a vector of pairs; its own insertion searches it.
    auto &entries = static_cast<Json::object_t::Container &>(
        f.value.get_ref<Json::object_t &>());
    auto [at, fresh] = f.keys.try_emplace(f.key, entries.size());
    if (fresh)
      entries.emplace_back(std::move(f.key), std::move(v));
    else
      entries[at->second].second = std::move(v);
    return true;
  }

  bool open(Json empty) {
    if (frames_.size() >= kMaxNestingDepth)
      throw JsonTooDeep();
    frames_.push_back(Frame{std::move(empty), {}, {}});
    return true;
  }

  bool close() {
    Json done = std::move(frames_.back().value);
    frames_.pop_back();
    return put(std::move(done));
  }

  std::vector<Frame> frames_;
  Json root_;
};

} // namespace

Json parseOrderedJson(std::string_view text) {
  Builder b;
  Json::sax_parse(text.begin(), text.end(), &b);
  return b.take();
}

} // namespace kiln::chat
