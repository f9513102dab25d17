//===- SchemaPrefixFuzzer.cpp - libFuzzer target for reply constraints ----===//
//
// A request's JSON schema (response_format json_schema, a tool's
// parameters) is untrusted input to kiln-serve. The input is a schema's
// text, a NUL byte, and a reply's bytes: the schema is parsed and compiled
// (an error is fine), and what compiles takes the reply in pieces, alone
// and behind ThinkFirst, with `accepts` checked against `push` on a copy
// at every piece: never a crash, a hang or a disagreement. Built and run
// by utils/fuzz.sh, seeded with a few schemas.
//
//===----------------------------------------------------------------------===//
#include "chat/JsonValue.h"
#include "chat/SchemaPrefix.h"
#include "chat/ThinkFirst.h"

#include "Pieces.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

using namespace kiln::chat;

namespace {

template <class P> void feed(P p, std::string_view reply) {
  kiln::fuzz::feedChecked(p, reply);
  (void)p.complete();
  (void)p.final();
  (void)p.key();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view in(reinterpret_cast<const char *>(data), size);
  const size_t nul = in.find('\0');
  if (nul == std::string_view::npos)
    return 0;
  kiln::Expected<Value> doc = parseJsonValue(in.substr(0, nul), "schema");
  if (!doc)
    return 0;
  kiln::Expected<std::shared_ptr<const JsonSchema>> schema =
      JsonSchema::compile(*doc, "schema");
  if (!schema)
    return 0;
  const std::string_view reply = in.substr(nul + 1);
  feed(SchemaPrefix(*schema), reply);
  feed(ThinkFirst(std::make_unique<SchemaPrefix>(*schema)), reply);
  return 0;
}
