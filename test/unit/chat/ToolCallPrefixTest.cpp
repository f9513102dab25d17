//===- ToolCallPrefixTest.cpp - Replies that must call a tool --------------===//
//
// Calls in the GLM template's form taken byte by byte (whole only after the
// closing marker), texts that go wrong at a stated byte, one call against
// several, and `accepts` against `push` on seeded random pieces.
//
//===----------------------------------------------------------------------===//
#include "chat/ToolCallPrefix.h"

#include "support/Random.h"

#include "ConstraintStates.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace kiln::chat;

namespace {

const std::vector<ToolSignature> kTools = {
    {"get_weather", {"city", "days"}, {nullptr, typeSchema("integer")}, {}},
    {"get", {}, {}, {}}, // a prefix of another name; any key
    {"set",
     {"level", "on"},
     {typeSchema("number"), typeSchema("boolean")},
     {false, true}}, // "on" is required
};

const std::string kCall = "<tool_call>get_weather\n"
                          "<arg_key>city</arg_key>\n"
                          "<arg_value>Paris </arg_value\n <b></arg_value>\n"
                          "<arg_key>days</arg_key>\n"
                          "<arg_value>2</arg_value>\n"
                          "</tool_call>";
const std::string kBare = "<tool_call>get\n"
                          "<arg_key>any key</arg_key>\n"
                          "<arg_value></arg_value>\n"
                          "</tool_call>";

void takeAll(ToolCallPrefix &p, const std::string &text) {
  for (size_t i = 0; i < text.size(); ++i) {
    ASSERT_FALSE(p.complete()) << text << ": whole before byte " << i;
    ASSERT_TRUE(p.accepts(text.substr(i, 1))) << text << ": byte " << i;
    ASSERT_TRUE(p.push(text.substr(i, 1))) << text << ": byte " << i;
  }
}

TEST(ToolCallPrefix, TakesTheTemplatesForm) {
  const std::string typed = "<tool_call>set\n<arg_key>level</arg_key>\n"
                            "<arg_value>-12.5e+3</arg_value>\n"
                            "<arg_key>on</arg_key>\n<arg_value> false\n"
                            "</arg_value>\n</tool_call>";
  for (const std::string &call :
       {kCall, kBare, typed,
        std::string("<tool_call>get_weather\n</tool_call>")}) {
    ToolCallPrefix one(kTools, false);
    takeAll(one, "\n " + call);
    EXPECT_TRUE(one.complete()) << call;
    EXPECT_TRUE(one.final()) << call;
    EXPECT_FALSE(one.accepts("\n<")) << call; // one call: no second
  }
  ToolCallPrefix several(kTools, true);
  takeAll(several, kCall);
  EXPECT_TRUE(several.complete());
  EXPECT_FALSE(several.final());
  ASSERT_TRUE(several.push("\n"));
  EXPECT_TRUE(several.complete());
  ASSERT_TRUE(several.push(kBare.substr(0, 5)));
  EXPECT_FALSE(several.complete()); // inside a second call
  ASSERT_TRUE(several.push(kBare.substr(5)));
  EXPECT_TRUE(several.complete());
}

TEST(ToolCallPrefix, WhitespaceAroundCallsIsBounded) {
  // At most 64 bytes of it in a row before a call and between calls.
  ToolCallPrefix p(kTools, true);
  ASSERT_TRUE(p.push(std::string(64, ' ')));
  EXPECT_FALSE(p.accepts("\n"));
  ASSERT_TRUE(p.push(kBare));
  ASSERT_TRUE(p.push(std::string(63, '\n')));
  EXPECT_TRUE(p.accepts(" <"));
  EXPECT_FALSE(p.accepts("  "));
  ASSERT_TRUE(p.push(" " + kCall));
  EXPECT_TRUE(p.complete());
}

TEST(ToolCallPrefix, ControlTokensOnlyAsWholeMarkers) {
  // A special token's bytes would be text inside a key or a value; as a
  // control token it is taken only as one of GLM's markers, where the call
  // takes that marker.
  const std::string reserved = "<|reserved_special_7|>";
  ToolCallPrefix p(kTools, false);
  EXPECT_TRUE(p.acceptsControl("<tool_call>"));
  EXPECT_FALSE(p.acceptsControl("<arg_key>"));
  EXPECT_FALSE(p.acceptsControl("<tool"));
  ASSERT_TRUE(p.push("<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                     "<arg_value>Par"));
  EXPECT_TRUE(p.accepts(reserved)); // as text: any bytes
  EXPECT_FALSE(p.acceptsControl(reserved));
  EXPECT_TRUE(p.acceptsControl("</arg_value>"));
  EXPECT_FALSE(p.acceptsControl("</arg_key>")); // text of the value
  ToolCallPrefix bare(kTools, false);
  ASSERT_TRUE(bare.push("<tool_call>get\n<arg_key>any "));
  EXPECT_FALSE(bare.acceptsControl(reserved));
  EXPECT_TRUE(bare.acceptsControl("</arg_key>"));
  // Inside a typed value's string, a marker is text too.
  ToolCallPrefix typed(kTools, false);
  ASSERT_TRUE(typed.push("<tool_call>set\n<arg_key>on</arg_key>\n"
                         "<arg_value>"));
  EXPECT_FALSE(typed.acceptsControl("</arg_value>")); // no value yet
  ASSERT_TRUE(typed.push("true"));
  EXPECT_TRUE(typed.acceptsControl("</arg_value>"));
}

TEST(ToolCallPrefix, RefusesAtTheFirstWrongByte) {
  struct Case {
    std::string text;
    size_t bad;
  };
  const std::vector<Case> cases = {
      {"Sure: <tool_call>", 0}, // text before the call
      {"<tool-call>", 5},
      {"<tool_call>get_wether\n", 17},               // not a function's name
      {"<tool_call>get_weather </tool_call>", 22},   // the name's newline
      {"<tool_call>get\n<arg_key>a\nb", 25},         // a free key's newline
      {"<tool_call>get_weather\n<arg_key>town", 32}, // not a parameter
      {"<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>", 46},
      {"<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>x"
       "</arg_value><arg_key>",
       71}, // the value's newline
      {"<tool_call>get_weather\n<arg_value>", 28},
      {"<tool_call>get_weather\n</tool_call>x", 35},
      // Typed values: an integer has no fraction, a number no leading
      // zero, a boolean is true or false, and none may be empty.
      {"<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>2.", 59},
      {"<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>x", 58},
      {"<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value><", 58},
      {"<tool_call>set\n<arg_key>level</arg_key>\n<arg_value>01", 52},
      {"<tool_call>set\n<arg_key>level</arg_key>\n<arg_value>-1.<", 54},
      {"<tool_call>set\n<arg_key>on</arg_key>\n<arg_value>tru<", 51},
      {"<tool_call>set\n<arg_key>on</arg_key>\n<arg_value>truex", 52},
      // A listed parameter at most once; a required one before the end.
      {"<tool_call>set\n<arg_key>on</arg_key>\n<arg_value>true</arg_value>"
       "\n<arg_key>o",
       74},
      {"<tool_call>set\n<arg_key>on</arg_key>\n<arg_value>true</arg_value>"
       "\n<arg_key>level</arg_key>\n<arg_value>1</arg_value>\n<a",
       116},
      {"<tool_call>set\n</tool_call>", 16},
      {"<tool_call>set\n<arg_key>level</arg_key>\n<arg_value>1</arg_value>"
       "\n</",
       66},
  };
  for (const Case &c : cases) {
    ToolCallPrefix p(kTools, true);
    for (size_t i = 0; i < c.bad; ++i)
      ASSERT_TRUE(p.push(c.text.substr(i, 1))) << c.text << ": byte " << i;
    EXPECT_FALSE(p.accepts(c.text.substr(c.bad, 1))) << c.text;
    EXPECT_FALSE(p.push(c.text.substr(c.bad))) << c.text;
    // Refused without a change: the prefix still takes what it took.
    ToolCallPrefix fresh(kTools, true);
    EXPECT_EQ(fresh.push(c.text.substr(0, c.bad)), true) << c.text;
    EXPECT_EQ(fresh.complete(), p.complete()) << c.text;
  }
}

TEST(ToolCallPrefix, ValuesHoldNoMarkerTheReaderWouldEndAt) {
  // The reader (ToolCalls.h) ends a call at the first "</tool_call>" and a
  // value at the first "</arg_value>", wherever they stand, so a value
  // holds neither: a free value not "</tool_call>" (it ends at
  // "</arg_value>"), a typed value's strings neither. A fuzz run found a
  // free value holding "</tool_call>" taken whole, which the reader then
  // cut into text and a second call.
  const std::vector<ToolSignature> tools = {
      {"put", {"items", "note"}, {typeSchema("array"), nullptr}, {}}};
  const std::string items = "<tool_call>put\n<arg_key>items</arg_key>\n"
                            "<arg_value>[\"a";
  const std::string note = "<tool_call>put\n<arg_key>note</arg_key>\n"
                           "<arg_value>a";
  for (const std::string &marker :
       {std::string("</tool_call>"), std::string("</arg_value>")}) {
    const std::string head = marker.substr(0, marker.size() - 1);
    ToolCallPrefix typed(tools, false);
    ASSERT_TRUE(typed.push(items + head)) << marker;
    EXPECT_FALSE(typed.accepts(">")) << marker;
    EXPECT_FALSE(typed.push(">")) << marker;
    EXPECT_FALSE(typed.accepts(">\"]")) << marker; // with more bytes
    // Cut short of the marker, the same bytes are a string's text.
    ASSERT_TRUE(typed.push("x\"]</arg_value>\n</tool_call>")) << marker;
    EXPECT_TRUE(typed.complete()) << marker;
  }
  ToolCallPrefix free(tools, false);
  ASSERT_TRUE(free.push(note + "</tool_call"));
  EXPECT_FALSE(free.accepts(">"));
  EXPECT_FALSE(free.push(">x</arg_value>"));
  ASSERT_TRUE(free.push("!</tool_cal></arg_value>\n</tool_call>"));
  EXPECT_TRUE(free.complete());
}

TEST(ToolCallPrefix, NamesReadBackAsThemselves) {
  // The reader trims names and keys, so one with whitespace at an end
  // would come back as another: not writable.
  EXPECT_TRUE(writableInMarkup("get weather"));
  for (const char *name : {"", "a<b", "a\nb", " a", "a ", "\ta", "a\r"})
    EXPECT_FALSE(writableInMarkup(name)) << name;
  ValueMap properties, schema;
  properties.set("ok", Value::map(ValueMap()));
  properties.set(" k", Value::map(ValueMap()));
  schema.set("type", Value("object"));
  schema.set("properties", Value::map(std::move(properties)));
  const Value params = Value::map(std::move(schema));
  kiln::Expected<ToolSignature> sig = toolSignature("f", params);
  ASSERT_FALSE(sig);
  EXPECT_EQ(sig.error().field(), " k");
}

TEST(ToolCallPrefix, AcceptsAgreesWithPushOnRandomPieces) {
  const uint64_t seed = 20261205;
  SCOPED_TRACE("seed " + std::to_string(seed));
  kiln::Rng rng(seed);
  std::vector<std::string> texts = {kCall, kBare, kCall + "\n" + kBare};
  const std::string odd = "<>/\n _akt";
  for (int k = 0; k < 60; ++k) {
    std::string c = texts[k % 3];
    c[rng.below(c.size())] = odd[rng.below(odd.size())];
    texts.push_back(c);
  }
  size_t pieces = 0, refused = 0;
  for (const std::string &text : texts) {
    ToolCallPrefix p(kTools, true);
    for (size_t at = 0; at < text.size();) {
      const std::string piece = text.substr(at, 1 + rng.below(12));
      const bool accepted = p.accepts(piece);
      ToolCallPrefix copy = p;
      ASSERT_EQ(copy.push(piece), accepted) << text << " at " << at;
      ++pieces;
      if (!accepted) {
        ++refused;
        break;
      }
      ASSERT_TRUE(p.push(piece));
      at += piece.size();
    }
  }
  EXPECT_GT(pieces, 300u);
  EXPECT_GT(refused, 10u);
}

} // namespace

namespace {

/// States with equal keys accept the same probes and agree on complete().
TEST(ToolCallPrefix, EqualKeysAcceptAlike) {
  const std::vector<std::string> probes = {"<",
                                           "</",
                                           "<tool_call>",
                                           "g",
                                           "get\n",
                                           "get_weather\n",
                                           "c",
                                           "city",
                                           "\n",
                                           " ",
                                           "</arg_value>",
                                           "</arg_key>\n<arg_value>",
                                           "x",
                                           ">"};
  const std::vector<ToolCallPrefix> states =
      statesAlong(ToolCallPrefix(kTools, true), kCall + "\n" + kBare);
  EXPECT_GT(checkEqualKeys(states, probes), 3u); // inside the values
}

} // namespace
