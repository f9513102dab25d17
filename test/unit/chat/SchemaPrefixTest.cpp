//===- SchemaPrefixTest.cpp - JSON replies a schema accepts
//----------------===//
//
// Schemas refused at compile time with the keyword's JSON pointer; valid
// documents taken byte by byte (whole only at the end); texts refused at a
// stated byte; anyOf followed as alternatives; `accepts` against `push` on
// seeded random cuts; equal keys accepting alike; and seeded random walks
// that must never reach a state no byte continues (a reply can always be
// finished), each walk's text also a JSON prefix to chat::JsonPrefix.
//
//===----------------------------------------------------------------------===//
#include "chat/SchemaPrefix.h"
#include "chat/JsonPrefix.h"
#include "chat/JsonValue.h"
#include "chat/SchemaPattern.h"
#include "chat/ToolCallPrefix.h"

#include "support/Random.h"

#include "ConstraintStates.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <string>
#include <vector>

using namespace kiln;
using namespace kiln::chat;

namespace {

std::shared_ptr<const JsonSchema> compileText(const std::string &text) {
  Expected<Value> v = parseJsonValue(text, "schema");
  EXPECT_TRUE(v.hasValue()) << text;
  Expected<std::shared_ptr<const JsonSchema>> s =
      JsonSchema::compile(*v, "schema");
  EXPECT_TRUE(s.hasValue()) << text << ": " << (s ? "" : s.error().message());
  return s ? *s : nullptr;
}

std::string compileError(const std::string &text) {
  Expected<Value> v = parseJsonValue(text, "schema");
  EXPECT_TRUE(v.hasValue()) << text;
  Expected<std::shared_ptr<const JsonSchema>> s =
      JsonSchema::compile(*v, "schema");
  return s ? "" : s.error().message();
}

const char *kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 5},
    "age": {"type": "integer", "minimum": -4, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "ab", 1, 12, null]},
             "minItems": 1, "maxItems": 3},
    "ratio": {"type": ["number", "null"]},
    "share": {"type": "number", "exclusiveMinimum": -0.5, "maximum": 2.25},
    "nick": {"anyOf": [{"type": "string"}, {"type": "boolean"}]},
    "code": {"type": "string", "pattern": "^[A-Z]{2}(-[0-9]+)?$"}
  },
  "required": ["name", "age"],
  "additionalProperties": false
})";

const char *kTree = R"({
  "$defs": {"node": {"type": "object",
                     "properties": {"v": {"type": "integer"},
                                    "kids": {"type": "array",
                                             "items": {"$ref": "#/$defs/node"}}},
                     "required": ["v"], "additionalProperties": false}},
  "$ref": "#/$defs/node"
})";

const char *kOne = R"({"type": "object", "properties": {"a": {"type":
    "boolean"}}, "additionalProperties": false})";

const char *kOpen = R"({"type": "object", "properties": {"id": {"const": 7}},
                        "required": ["id", "extra"]})";

void expectWhole(const std::shared_ptr<const JsonSchema> &schema,
                 const std::string &text) {
  SchemaPrefix p(schema);
  for (size_t i = 0; i < text.size(); ++i) {
    ASSERT_FALSE(p.final() &&
                 text.find_first_not_of(" \t\r\n", i) != std::string::npos)
        << text << ": final before byte " << i;
    ASSERT_TRUE(p.accepts(text.substr(i, 1))) << text << ": byte " << i;
    ASSERT_TRUE(p.push(text.substr(i, 1))) << text << ": byte " << i;
  }
  EXPECT_TRUE(p.complete()) << text;
}

/// `text` is taken up to byte `at` and refused there.
void expectRefusedAt(const std::shared_ptr<const JsonSchema> &schema,
                     const std::string &text, size_t at) {
  SchemaPrefix p(schema);
  ASSERT_TRUE(p.push(text.substr(0, at))) << text;
  const std::string before = p.key();
  EXPECT_FALSE(p.accepts(text.substr(at, 1))) << text << " at " << at;
  EXPECT_FALSE(p.push(text.substr(at))) << text << " at " << at;
  EXPECT_EQ(p.key(), before) << "a refusal changed the state: " << text;
}

/// A text and the byte it is refused at.
struct Refusal {
  const char *text;
  size_t at;
};

void expectRefusals(const std::shared_ptr<const JsonSchema> &schema,
                    std::initializer_list<Refusal> refusals) {
  for (const Refusal &r : refusals)
    expectRefusedAt(schema, r.text, r.at);
}

} // namespace

TEST(SchemaPrefix, RefusesWhatItCannotKeep) {
  struct Case {
    const char *schema, *message;
  } cases[] = {
      {R"({"type": "integer", "not": {"const": 3}})",
       "schema: #/not: keyword 'not' is not supported"},
      {R"({"type": "number", "multipleOf": 0.1})",
       "#/multipleOf: a multiple is kept only of a whole number"},
      {R"({"type": "number", "multipleOf": 0})",
       "#/multipleOf: must be a number above 0"},
      {R"({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6})",
       "#/minimum: no multiple of at most 18 digits lies within the bounds"},
      {R"({"type": "number", "multipleOf": 7, "minimum": 1, "maximum": 6})",
       "#/minimum: no multiple of at most 15 digits"},
      {R"({"type": "string", "minimum": 3})",
       "#/minimum: bounds on a schema whose type admits no number"},
      {R"({"type": "number", "minimum": 1e15})",
       "#/minimum: no number of at most 15 digits without an exponent"},
      {R"({"type": "number", "exclusiveMinimum": 0, "maximum": 1e-16})",
       "#/maximum: no number of at most 15 digits"},
      {R"({"type": "number", "maximum": "3"})", "#/maximum: must be a number"},
      {R"({"type": "integer", "minimum": 3, "exclusiveMaximum": 3})",
       "#/minimum: no integer of at most 18 digits lies within the bounds"},
      {R"({"properties": {"a": {"uniqueItems": true}}})",
       "schema: #/properties/a/uniqueItems: keyword 'uniqueItems'"},
      {R"({"pattern": "(?=a)b"})", "#/pattern: pattern: look-arounds"},
      {R"({"pattern": "(a)\\1"})", "#/pattern: pattern: the escape \\1"},
      {R"({"pattern": "a^b"})", "'^' and '$' are supported only first"},
      {R"({"pattern": "^a|b$"})", "an anchor beside a top-level '|'"},
      {R"({"pattern": "[z-a]"})", "a class range out of order"},
      {R"({"pattern": "a[]b"})", "a class that begins with ']'"},
      {R"({"pattern": "a{2,1}"})", "a counted repeat must be"},
      {R"({"pattern": "(a"})", "a '(' without its ')'"},
      {R"({"pattern": "a**"})", "a quantifier after a quantifier"},
      {R"({"pattern": "a{2}{3}"})", "a quantifier after a quantifier"},
      {R"({"pattern": "(ab)+??"})", "a quantifier after a quantifier"},
      {R"({"pattern": "a*{x}"})", "a '{' that is not a counted repeat"},
      {R"({"pattern": "[^\\s\\S]"})", "#/pattern: pattern: matches no string"},
      {R"({"pattern": "^(ab){200}$"})", "too large for constrained decoding"},
      {R"({"type": "string", "pattern": "a", "maxLength": 3})",
       "#/pattern: a pattern beside minLength / maxLength"},
      {R"({"oneOf": [true]})", "#/oneOf: keyword 'oneOf'"},
      {"false", "#: the schema false accepts no value"},
      {R"({"type": "objekt"})", "#/type: expected a JSON type name"},
      {R"({"properties": {"a\"b": {}}})",
       "#/properties/a\"b: the property name needs an escape"},
      {R"({"properties": {"a": {}}, "required": ["b"],
           "additionalProperties": false})",
       "#/required: 'b' is required but not among the properties"},
      {R"({"$ref": "#/$defs/missing"})",
       "#/$ref: $ref '#/$defs/missing' names nothing"},
      {R"({"$ref": "other.json#/a"})", "#/$ref: $ref must be a string"},
      {R"({"$ref": "#/$defs/a", "type": "string"})",
       "#/$ref: $ref beside other keywords"},
      {R"({"allOf": [{}, {}]})", "#/allOf: only an allOf of one schema"},
      {R"({"type": "string", "minLength": 4, "maxLength": 3})",
       "#/minLength: longer than maxLength"},
      {R"({"type": "array", "minItems": -1})",
       "#/minItems: must be a non-negative integer"},
      {R"({"type": "string", "enum": [1, 2]})",
       "#/enum: no value has the schema's type"},
      {R"({"enum": [1], "maxLength": 2})", "#/enum: enum beside other"},
      {R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
       "accepts no value"},
      {R"({"type": "object", "properties": {"a": {"type": "array",
           "minItems": 1, "items": false}}})",
       "#/properties/a/minItems: more items are required than allowed"},
  };
  for (const Case &c : cases) {
    const std::string message = compileError(c.schema);
    EXPECT_NE(message.find(c.message), std::string::npos)
        << c.schema << "\n  gave: " << message;
  }
  // A required property whose schema accepts nothing, found after the
  // fixpoint (the node itself parses).
  EXPECT_NE(compileError(R"({"$defs": {"loop": {"type": "object",
      "properties": {"next": {"$ref": "#/$defs/loop"}}, "required": ["next"]}},
      "$ref": "#/$defs/loop"})")
                .find("accepts no value"),
            std::string::npos);
}

TEST(SchemaPrefix, WholeDocuments) {
  auto person = compileText(kPerson);
  ASSERT_TRUE(person);
  for (const char *text : {
           R"({"name":"Al","age":30})",
           R"( { "age" : -4 , "name" : "abcde" } )",
           R"({"name":"\u00e9","age":0,"tags":["ab",12,null],"ratio":1.5e3})",
           R"({"name":"x","age":1,"tags":[1],"ratio":null,"nick":true})",
           R"({"name":"x","age":1,"nick":"any \"text\""})",
           "{\"name\":\"\xf0\x9f\x98\x80\xc3\xa9\",\"age\":2}",
       })
    expectWhole(person, text);
  auto tree = compileText(kTree);
  ASSERT_TRUE(tree);
  expectWhole(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})");
  auto open = compileText(kOpen);
  ASSERT_TRUE(open);
  expectWhole(open, R"({"extra":[1,{"x":null}],"id":7,"other":"y"})");
  // A root that is not an object: a number may end at the end of the text,
  // an enum value once nothing longer can follow.
  auto number = compileText(R"({"type": "number"})");
  SchemaPrefix p(number);
  ASSERT_TRUE(p.push("-1.5"));
  EXPECT_TRUE(p.complete());
  EXPECT_FALSE(p.final());
  auto choice = compileText(R"({"enum": [1, 12, "x"]})");
  SchemaPrefix q(choice);
  ASSERT_TRUE(q.push("1"));
  EXPECT_TRUE(q.complete());
  EXPECT_FALSE(q.final()); // "12" may follow
  ASSERT_TRUE(q.push("2"));
  EXPECT_TRUE(q.final());
  SchemaPrefix r(person);
  ASSERT_TRUE(r.push(R"({"name":"a","age":1})"));
  EXPECT_TRUE(r.final());
}

TEST(SchemaPrefix, RefusedAtTheStatedByte) {
  auto person = compileText(kPerson);
  ASSERT_TRUE(person);
  struct Case {
    const char *text;
    size_t at;
  } cases[] = {
      {R"({"name":"Al"})", 12},              // '}' before "age"
      {R"({"nam":1})", 5},                   // '"' ends a key no name is
      {R"({"named":1})", 6},                 // 'd': past every name
      {R"({"zzz":1})", 2},                   // no name begins with 'z'
      {R"({"age":1.5})", 8},                 // an integer has no fraction
      {R"({"age":"1"})", 7},                 // a string where an integer is
      {R"({"name":""})", 9},                 // minLength 1
      {R"({"name":"abcdef"})", 14},          // maxLength 5
      {R"({"age":1,"age":2})", 10},          // no name left begins so
      {R"({"age":1,"tags":[]})", 17},        // minItems 1
      {R"({"age":1,"tags":[1,1,1,1]})", 22}, // maxItems 3
      {R"({"age":1,"tags":["b"]})", 18},     // not an enum value
      {R"({"age":1,"tags":[123]})", 19},     // 12 and then a digit
      {R"({"age":1,"nick":1})", 16},         // neither a string nor a boolean
      {R"({"age":1,"name":"\ud83d\ude00"})", 20}, // a surrogate escape
      {R"({"n\u0061me":"x"})", 3},       // keys are written without escapes
      {R"({"age":1,"name":"x"} 1)", 21}, // only whitespace after the value
  };
  for (const Case &c : cases)
    expectRefusedAt(person, c.text, c.at);
  // Once every property is read, no ',' (no key could follow it).
  auto one = compileText(kOne);
  ASSERT_TRUE(one);
  expectRefusedAt(one, R"({"a":true,)", 9);
  expectRefusedAt(one, R"({"a":true,"b":1})", 9);
  // With additional properties allowed, a key equal to one read before is
  // still refused at its closing quote; a longer one is another key.
  auto open = compileText(kOpen);
  ASSERT_TRUE(open);
  expectRefusedAt(open, R"({"id":7,"id":7})", 11);
  expectWhole(open, R"({"id":7,"idx":7,"extra":0})");
  expectRefusedAt(open, R"({"id":8})", 6);
  expectRefusedAt(open, R"({"id":7})", 7); // "extra" is required
}

TEST(SchemaPrefix, AlternativesSideBySide) {
  auto either = compileText(R"({"anyOf": [
      {"type": "object", "properties": {"a": {"type": "integer"}},
       "required": ["a"], "additionalProperties": false},
      {"type": "object", "properties": {"a": {"type": "string"},
                                        "b": {"type": "null"}},
       "required": ["a"], "additionalProperties": false}]})");
  ASSERT_TRUE(either);
  SchemaPrefix p(either);
  ASSERT_TRUE(p.push(R"({"a":)"));
  EXPECT_EQ(p.alternatives(), 2u);
  EXPECT_TRUE(p.accepts("1}"));
  EXPECT_TRUE(p.accepts("\"x\",\"b\":null}"));
  EXPECT_FALSE(p.accepts("1,\"b\""));
  ASSERT_TRUE(p.push("\"x\""));
  EXPECT_EQ(p.alternatives(), 1u);
  EXPECT_TRUE(p.accepts(",\"b\":null}"));
  // Two alternatives that reach the same state are followed as one.
  auto same = compileText(R"({"$defs": {"i": {"type": "integer"}},
      "anyOf": [{"$ref": "#/$defs/i"}, {"$ref": "#/$defs/i"}]})");
  SchemaPrefix q(same);
  ASSERT_TRUE(q.push("1"));
  EXPECT_EQ(q.alternatives(), 1u);
}

TEST(SchemaPrefix, AcceptsAgreesWithPushAndEqualKeysAcceptAlike) {
  auto person = compileText(kPerson);
  auto tree = compileText(kTree);
  ASSERT_TRUE(person && tree);
  const uint64_t seed = 20261205;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  struct Doc {
    std::shared_ptr<const JsonSchema> schema;
    std::string text;
  } docs[] = {
      {person, R"({"name":"Al","age":30,"tags":["ab",12,null],"nick":"x"})"},
      {person, R"({ "age" : 7 , "name" : "abc" , "ratio" : -0.5e-2 })"},
      {tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]})"},
  };
  std::vector<std::string> probes = {"}", ",", "\"", "1", "]", "\"a",   ":",
                                     "n", "t", " ",  "{", "[", "\"v\":"};
  size_t equalPairs = 0;
  for (const Doc &d : docs) {
    for (int round = 0; round < 40; ++round) {
      SchemaPrefix p(d.schema);
      size_t at = 0;
      while (at < d.text.size()) {
        size_t len = 1 + rng.below(6);
        std::string piece = d.text.substr(at, len);
        // Sometimes a corrupted piece: a byte changed.
        if (rng.uniform() < 0.3) {
          std::string bad = piece;
          bad[rng.below(bad.size())] = "}]\":,x1 {"[rng.below(9)];
          SchemaPrefix copy = p;
          EXPECT_EQ(p.accepts(bad), copy.push(bad)) << d.text << " " << bad;
        }
        EXPECT_TRUE(p.accepts(piece)) << d.text << " at " << at;
        ASSERT_TRUE(p.push(piece));
        at += piece.size();
      }
      EXPECT_TRUE(p.complete());
    }
    equalPairs +=
        checkEqualKeys(statesAlong(SchemaPrefix(d.schema), d.text), probes);
  }
  // Inside strings and between members, states recur.
  EXPECT_GT(equalPairs, 5u);
}

TEST(SchemaPrefix, RandomWalksCanAlwaysFinish) {
  const uint64_t seed = 7;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  // Bytes a walk draws from (UTF-8's lead and continuation bytes among
  // them, so that multi-byte characters are walked through).
  std::vector<std::string> alphabet;
  for (int b = 0x20; b < 0x7F; ++b)
    alphabet.push_back(std::string(1, char(b)));
  for (const char *s : {"\n", "\xc3", "\xa9", "\xe2", "\x82", "\xac", "\xf0",
                        "\x9f", "\x98", "\x80", "\xed"})
    alphabet.push_back(s);
  size_t finished = 0;
  for (const char *schemaText : {kPerson, kTree, kOpen, kOne}) {
    auto schema = compileText(schemaText);
    ASSERT_TRUE(schema);
    for (int walk = 0; walk < 30; ++walk) {
      SchemaPrefix p(schema);
      JsonPrefix json(false);
      std::string text;
      for (int i = 0; i < 300 && !p.final(); ++i) {
        std::vector<const std::string *> ok;
        bool onward = p.complete(); // whitespace alone is no way on
        for (const std::string &b : alphabet)
          if (p.accepts(b)) {
            ok.push_back(&b);
            onward = onward || (b != " " && b != "\n");
          }
        ASSERT_TRUE(onward)
            << "nothing but whitespace continues "
            << ::testing::PrintToString(text) << " (" << schemaText << ")";
        // Favour the structural bytes, so that walks close what they open.
        const std::string *pick = ok[rng.below(ok.size())];
        for (const std::string *b : ok)
          if (rng.uniform() < 0.15 &&
              std::string("}]\",:").find((*b)[0]) != std::string::npos)
            pick = b;
        ASSERT_TRUE(p.push(*pick));
        ASSERT_TRUE(json.push(*pick)) << "not JSON: " << text << *pick;
        text += *pick;
      }
      if (p.final()) {
        EXPECT_TRUE(json.complete()) << text;
        ++finished;
      }
    }
  }
  // Some walks reached a whole value (the check above ran).
  EXPECT_GT(finished, 10u);
  std::printf("%zu of 120 walks whole\n", finished);
}

TEST(SchemaPrefix, ToolCallValuesKeepTheParametersSchema) {
  Expected<Value> doc = parseJsonValue(R"({
    "type": "object",
    "properties": {
      "where": {"type": "object",
                "properties": {"at": {"$ref": "#/$defs/place"},
                               "label": {"type": "string"}},
                "required": ["at"], "additionalProperties": false},
      "n": {"type": "integer", "not": {"const": 2}},
      "note": {"type": "string"},
      "tags": {"type": "array", "items": {"enum": ["x", "y"]}}
    },
    "required": ["where"],
    "$defs": {"place": {"type": "object",
                        "properties": {"lat": {"type": "number"}},
                        "required": ["lat"], "additionalProperties": false}}
  })",
                                       "parameters");
  ASSERT_TRUE(doc.hasValue());
  ToolSignature sig{"go", {}, {}, {}};
  for (const char *name : {"where", "n", "note", "tags"}) {
    sig.parameters.push_back(name);
    sig.values.push_back(parameterValues(*doc, name));
    sig.required.push_back(std::string(name) == "where");
  }
  EXPECT_TRUE(sig.values[0]);  // its own schema, the $ref resolved
  EXPECT_TRUE(sig.values[1]);  // 'not' cannot be kept: integer alone
  EXPECT_FALSE(sig.values[2]); // a string: any text
  EXPECT_TRUE(sig.values[3]);
  const std::string head = "<tool_call>go\n<arg_key>where</arg_key>\n"
                           "<arg_value>";
  const std::string tail = "</arg_value>\n</tool_call>";
  auto whole = [&](const std::string &text) {
    ToolCallPrefix p({sig}, false);
    return p.push(text) && p.complete();
  };
  EXPECT_TRUE(whole(head + R"({"at": {"lat": -1.5}})" + tail));
  EXPECT_TRUE(whole(head + " {\"at\":{\"lat\":2}}\n" + tail +
                    "\n")); // whitespace around a JSON value
  EXPECT_TRUE(whole(head + R"({"at":{"lat":0}}</arg_value>
<arg_key>n</arg_key>
<arg_value>0</arg_value>
<arg_key>note</arg_key>
<arg_value>any </text></arg_value>
<arg_key>tags</arg_key>
<arg_value>["y","x"]</arg_value>
</tool_call>)"));
  ToolCallPrefix p({sig}, false);
  ASSERT_TRUE(p.push(head + R"({"at":{"l)"));
  EXPECT_FALSE(p.accepts("o"));        // not "lat"
  EXPECT_FALSE(p.accepts("at\":1}<")); // "at" needs a whole object
  EXPECT_TRUE(p.accepts("at\":1}}<"));
  ToolCallPrefix q({sig}, false);
  ASSERT_TRUE(q.push("<tool_call>go\n<arg_key>tags</arg_key>\n<arg_value>"));
  EXPECT_FALSE(q.accepts("[\"z"));
  EXPECT_FALSE(q.accepts("[]</arg_value>\n</")); // "where" is required
  EXPECT_TRUE(q.accepts("[]</arg_value>\n<arg_key>where"));
  // accepts against push on seeded random pieces of calls whose values
  // hold '<' inside strings and end at the '<' of "</arg_value>".
  const uint64_t seed = 11;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  const std::vector<std::string> calls = {
      // A string may hold markup but not the two markers the reader ends
      // a value and a call at (ToolCallPrefixTest).
      head + R"({"at":{"lat":1},"label":"a<b></arg_key></arg_valu"})" + tail,
      head + R"( {"label":"<","at":{"lat":-0.5e1}} )" + tail,
      head + R"({"at":{"lat":2}}</arg_value>
<arg_key>note</arg_key>
<arg_value>x<y</arg_value>
</tool_call>)"};
  size_t refused = 0;
  for (int round = 0; round < 60; ++round) {
    std::string text = calls[size_t(round) % calls.size()];
    if (round >= 3) // a byte changed
      text[rng.below(text.size())] = "<>\"}/:a1 "[rng.below(9)];
    ToolCallPrefix p({sig}, false);
    const bool taken = takePieces(p, text, rng, 9);
    refused += !taken;
    if (round < 3) {
      EXPECT_TRUE(taken && p.complete()) << text;
    }
  }
  EXPECT_GT(refused, 10u);
  // The generator's cache: states along a call with equal keys accept
  // alike.
  const std::string call = head + R"({"at":{"lat":12.5}})" + tail;
  std::vector<ToolCallPrefix> states =
      statesAlong(ToolCallPrefix({sig}, false), call);
  checkEqualKeys(states, {"<", "}", "\"", "1", "</arg_value>", ",", " "});
}

TEST(SchemaPrefix, IntegerBoundsAsTheDigitsCome) {
  auto age = compileText(R"({"type": "integer", "minimum": 18,
                             "exclusiveMaximum": 130})");
  ASSERT_TRUE(age);
  for (const char *text : {"18", "129", "99", "100"})
    expectWhole(age, text);
  // 13 and 130-139 miss 18-129; so do 200-299; 1 and 17 end below.
  expectRefusals(age, {{"-", 0},
                       {"0", 0},
                       {"130", 1},
                       {"2000", 2},
                       {"1 ", 1},
                       {"17 ", 1},
                       {"18.5", 2},
                       {"1e3", 1}});
  SchemaPrefix p(age);
  ASSERT_TRUE(p.push("1"));
  EXPECT_FALSE(p.complete()); // 1 is below 18; 10-19 and 100-129 lead in
  ASSERT_TRUE(p.push("9"));
  EXPECT_TRUE(p.complete());
  // Negative bounds, "-0", draft 4's boolean exclusives, and an object's
  // member that must end within them.
  auto cold = compileText(R"({"type": "integer", "minimum": -40,
                              "maximum": 0, "exclusiveMaximum": true})");
  ASSERT_TRUE(cold);
  expectWhole(cold, "-40");
  expectWhole(cold, "-1");
  expectRefusedAt(cold, "-0 ", 1); // -0 is 0, not below it
  expectRefusedAt(cold, "-41", 2);
  expectRefusedAt(cold, "-400", 3);
  expectRefusedAt(cold, "5", 0);
  auto obj = compileText(R"({"type": "object", "properties": {
      "n": {"type": "integer", "maximum": 5.5}}})");
  ASSERT_TRUE(obj);
  expectWhole(obj, R"({"n": 5})");
  expectRefusedAt(obj, R"({"n": 6})", 6);
  expectRefusedAt(obj, R"({"n": 50})", 7);
  // At most 18 digits where bounded; without bounds, any integer.
  auto wide = compileText(R"({"type": "integer", "minimum": 0})");
  ASSERT_TRUE(wide);
  expectWhole(wide, "999999999999999999");
  expectRefusedAt(wide, "9999999999999999999", 18);
  expectWhole(compileText(R"({"type": "integer"})"), "99999999999999999999999");
}

TEST(SchemaPrefix, NumberBoundsAsTheDigitsCome) {
  // A probability: [0, 1] in at most 15 digits, no exponent.
  auto p = compileText(R"({"type": "number", "minimum": 0, "maximum": 1})");
  ASSERT_TRUE(p);
  for (const char *text : {"0", "1", "0.5", "1.0", "0.000000000000001",
                           "0.999999999999999", "-0", "-0.0"})
    expectWhole(p, text);
  expectRefusals(p, {{"2", 0},
                     {"1.5", 2},
                     {"-1", 1},
                     {"10", 1},
                     {"1e0", 1},
                     {"0.5E1", 3},
                     {"-0.1", 3},
                     {"0.0000000000000001", 17},
                     {"00", 1}});
  // "1." takes the point (1.0 is whole) and ends there: a digit must come.
  SchemaPrefix one(p);
  ASSERT_TRUE(one.push("1."));
  EXPECT_FALSE(one.complete());
  EXPECT_TRUE(one.accepts("0"));
  EXPECT_FALSE(one.accepts("1"));
  // Exclusive bounds on the decimal grid: (0.1, 0.3) holds 0.1000...01 up
  // to 0.2999...9 in 15 digits, not 0.1 or 0.3 themselves.
  auto open = compileText(R"({"type": "number", "exclusiveMinimum": 0.1,
                              "exclusiveMaximum": 0.3})");
  ASSERT_TRUE(open);
  expectWhole(open, "0.2");
  expectWhole(open, "0.100000000000001");
  expectWhole(open, "0.299999999999999");
  expectRefusedAt(open, "0.1 ", 3);
  expectRefusedAt(open, "0.3", 2);
  // 0.1 and 14 zeros is 0.1 itself, with no digit left to go above it.
  expectRefusedAt(open, "0.1000000000000001", 16);
  // A bound whose shortest form has 17 digits, negative ranges, and a
  // number in an object, which must end within its bounds.
  auto tiny = compileText(R"({"type": "number", "minimum": -2.5,
                              "maximum": -0.30000000000000004})");
  ASSERT_TRUE(tiny);
  expectWhole(tiny, "-2.5");
  expectWhole(tiny, "-0.31");
  expectRefusedAt(tiny, "-0.3 ", 4); // above -0.30000000000000004
  expectRefusedAt(tiny, "-2.6", 3);
  expectRefusedAt(tiny, "-3", 1);
  auto obj = compileText(R"({"type": "object", "properties": {
      "t": {"type": ["number", "null"], "minimum": -273.15}}})");
  ASSERT_TRUE(obj);
  expectWhole(obj, R"({"t": -273.15})");
  expectWhole(obj, R"({"t": null})");
  expectWhole(obj, R"({"t": 123456789012345})");
  expectRefusedAt(obj, R"({"t": -273.16})", 12);
  expectRefusedAt(obj, R"({"t": 1234567890123456})", 21);
  // Without bounds a number keeps its exponent and any length.
  expectWhole(compileText(R"({"type": "number"})"), "1.25e-300");
}

TEST(SchemaPrefix, NumberWalksEndWithinTheirBounds) {
  // Seeded random bounds (some exclusive, some of 17 significant digits,
  // some one-sided, some with a whole multipleOf), and random walks over the
  // bytes a number may use: each step must have a way on other than ending, or
  // be whole; each finished number, read by strtod, must satisfy the bounds as
  // a validator's doubles do.
  const uint64_t seed = 29;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  const std::string alphabet = "0123456789.-eE+ ";
  size_t ended = 0;
  for (int round = 0; round < 40; ++round) {
    auto pick = [&] {
      const double scale = std::pow(10.0, double(int(rng.below(9)) - 4));
      double x = (rng.uniform() * 2 - 1) * scale;
      if (rng.below(3) == 0)
        x = std::round(x * 100) / 100; // a short decimal
      return x;
    };
    double a = pick(), b = pick();
    if (a > b)
      std::swap(a, b);
    const bool exLo = rng.below(2), exHi = rng.below(2);
    const bool hasHi = rng.below(5) != 0, hasLo = !hasHi || rng.below(5) != 0;
    std::string schema = R"({"type": "number")";
    char buf[64];
    if (hasLo) {
      std::snprintf(buf, sizeof buf, "%.17g", a);
      schema += std::string(", \"") + (exLo ? "exclusiveMinimum" : "minimum") +
                "\": " + buf;
    }
    if (hasHi) {
      std::snprintf(buf, sizeof buf, "%.17g", b);
      schema += std::string(", \"") + (exHi ? "exclusiveMaximum" : "maximum") +
                "\": " + buf;
    }
    // Some rounds also ask for a whole multiple.
    const int multiple = rng.below(3) == 0 ? int(1 + rng.below(7)) : 0;
    if (multiple)
      schema += ", \"multipleOf\": " + std::to_string(multiple);
    schema += "}";
    Expected<std::shared_ptr<const JsonSchema>> made =
        JsonSchema::compile(*parseJsonValue(schema, "schema"), "schema");
    if (!made)
      continue; // no 15-digit number (or multiple) meets the bounds
    const std::shared_ptr<const JsonSchema> compiled = *made;
    for (int walk = 0; walk < 25; ++walk) {
      SchemaPrefix p(compiled);
      std::string text;
      for (int i = 0; i < 40; ++i) {
        std::string ok;
        for (char c : alphabet)
          if (p.accepts(std::string(1, c)))
            ok += c;
        const bool onward = ok.find_first_not_of(' ') != std::string::npos;
        ASSERT_TRUE(onward || p.complete()) << schema << " after " << text;
        if (p.complete() && (!onward || rng.below(6) == 0))
          break;
        std::string c(1, ok[rng.below(ok.size())]);
        if (c == " ") // whitespace only after a whole number
          c = std::string(1, ok[0]);
        ASSERT_TRUE(p.push(c));
        text += c;
      }
      if (!p.complete())
        continue; // 40 bytes of digits: long numbers are cut, not wrong
      ++ended;
      const std::string number = text.substr(0, text.find(' '));
      EXPECT_EQ(number.find_first_of("eE"), std::string::npos) << number;
      size_t digits = 0;
      for (char c : number)
        digits += c >= '0' && c <= '9';
      const bool loneZero = number.find("0.") == (number[0] == '-' ? 1u : 0u);
      EXPECT_LE(digits - (loneZero || number == "0" || number == "-0"), 15u)
          << number;
      const double v = std::strtod(number.c_str(), nullptr);
      if (hasLo) {
        EXPECT_TRUE(exLo ? v > a : v >= a) << schema << ": " << number;
      }
      if (hasHi) {
        EXPECT_TRUE(exHi ? v < b : v <= b) << schema << ": " << number;
      }
      if (multiple) {
        EXPECT_EQ(std::fmod(v, double(multiple)), 0.0)
            << schema << ": " << number;
      }
    }
  }
  std::printf("%zu numbers ended within their bounds\n", ended);
  EXPECT_GT(ended, 250u);
}

TEST(SchemaPrefix, MultiplesAsTheDigitsCome) {
  // Integers: multiples of 25 in [-60, 110].
  auto quarter = compileText(R"({"type": "integer", "multipleOf": 25,
                                 "minimum": -60, "maximum": 110})");
  ASSERT_TRUE(quarter);
  for (const char *text : {"0", "-0", "25", "100", "-50"})
    expectWhole(quarter, text);
  // -6x, 2x-20x and 12x hold no multiple of 25 within the bounds.
  expectRefusals(quarter, {{"3", 0},
                           {"-6", 1},
                           {"-7", 1},
                           {"12", 1},
                           {"20", 1},
                           {"125", 1},
                           {"105", 2}});
  SchemaPrefix two(quarter);
  ASSERT_TRUE(two.push("2"));
  EXPECT_FALSE(two.complete());
  // Numbers: whole multiples, a fraction of zeros allowed; alone, with no
  // bound, capped at 15 digits.
  auto even = compileText(R"({"type": "number", "multipleOf": 2})");
  ASSERT_TRUE(even);
  expectWhole(even, "4");
  expectWhole(even, "4.00");
  expectWhole(even, "-998");
  expectWhole(even, "999999999999998");
  expectRefusedAt(even, "4.5", 2);
  expectRefusedAt(even, "3 ", 1);
  expectRefusedAt(even, "4e2", 1);
  expectRefusedAt(even, "1000000000000000", 15);
  // An integer with a multiple and no bound: 18 digits at most.
  auto many = compileText(R"({"type": "integer", "multipleOf": 3})");
  ASSERT_TRUE(many);
  expectWhole(many, "999999999999999999");
  expectRefusedAt(many, "9999999999999999990", 18);
}

TEST(SchemaPrefix, PatternsAsTheCharactersCome) {
  auto id = compileText(R"({"type": "string",
                            "pattern": "^[a-z]+-[0-9]{2}$"})");
  ASSERT_TRUE(id);
  expectWhole(id, R"("ab-12")");
  expectWhole(id, R"("\u0061b-1\u0032")"); // escapes are their characters
  expectRefusedAt(id, R"("ab-1")", 5);     // one digit short
  expectRefusedAt(id, R"("AB")", 1);
  expectRefusedAt(id, R"("ab-123")", 6);
  expectRefusedAt(id, R"("ab-\ud83d")", 6); // \ud... is no digit
  expectRefusedAt(id, "\"ab\xe2", 3);       // nor is any U+2000-U+2FFF
  auto any = compileText(R"({"pattern": "^.*$"})");
  expectRefusedAt(any, R"("\ud83d\ude00")", 4); // no surrogate escapes
  // Unanchored: the match may stand anywhere.
  auto inside = compileText(R"({"pattern": "ab|c{2}"})");
  ASSERT_TRUE(inside);
  expectWhole(inside, R"("xxabyy")");
  expectWhole(inside, R"("cc")");
  expectRefusedAt(inside, R"("xxa")", 4);
  // Code points, '.', classes and escapes.
  auto accent = compileText(R"({"pattern": "^\u00e9[^a-c]\\d.$"})");
  ASSERT_TRUE(accent);
  expectWhole(accent, "\"\xc3\xa9z7\xe2\x82\xac\"");
  expectWhole(accent, R"("\u00e9Z9\t")");
  expectRefusedAt(accent, R"("\u00e9b")", 7);
  expectRefusedAt(accent, R"("\u00e9z7\n")", 10); // '.' is no newline
  // In an object, with alternatives and repeats.
  auto obj = compileText(R"({"type": "object", "properties": {
      "v": {"type": "string", "pattern": "^(v[0-9]+(\\.[0-9]+){0,2}|latest)$"}},
      "required": ["v"]})");
  ASSERT_TRUE(obj);
  expectWhole(obj, R"({"v": "v1.20.3"})");
  expectWhole(obj, R"({"v": "latest"})");
  expectRefusedAt(obj, R"({"v": "v1.2.3.4"})", 13);
  expectRefusedAt(obj, R"({"v": "lat"})", 10);
}

TEST(SchemaPrefix, RefChainsOnlySoLong) {
  // $refs are followed by recursion too: a chain of 200,000 ran the
  // compiler out of stack. Subschemas and $refs count alike toward
  // kMaxCompileDepth; the root and its property take two levels.
  auto chain = [](int refs) {
    std::string defs;
    for (int i = 0; i < refs; ++i)
      defs += "\"a" + std::to_string(i) + "\": {\"$ref\": \"#/$defs/a" +
              std::to_string(i + 1) + "\"}, ";
    return R"({"$defs": {)" + defs + "\"a" + std::to_string(refs) +
           R"(": {"type": "integer"}}, "type": "object", "additionalProperties":
           false, "properties": {"v": {"$ref": "#/$defs/a0"}}})";
  };
  const int most = JsonSchema::kMaxCompileDepth - 3;
  auto longest = compileText(chain(most));
  ASSERT_TRUE(longest);
  expectWhole(longest, R"({"v": 12})");
  expectRefusedAt(longest, R"({"v": "12"})", 6);
  const std::string deep = "schemas nested more than " +
                           std::to_string(JsonSchema::kMaxCompileDepth) +
                           " deep";
  EXPECT_NE(compileError(chain(most + 1)).find(deep), std::string::npos);
  EXPECT_NE(compileError(chain(20000)).find(deep), std::string::npos);
}

TEST(SchemaPrefix, PatternsNestOnlySoDeep) {
  // A pattern is untrusted input (a request's schema), and the compiler
  // parses and builds it recursively: a pattern of 200,000 '(' ran it out
  // of stack (found by fuzzing). Nesting is held to kMaxGroupDepth, and a
  // run of quantifiers ("a***...", which ECMA-262 refuses too) to one.
  const int most = SchemaPattern::kMaxGroupDepth;
  auto nested = [](int depth, const std::string &inner) {
    return R"({"type": "string", "pattern": "^)" + std::string(depth, '(') +
           inner + std::string(depth, ')') + R"($"})";
  };
  auto deepest = compileText(nested(most, "ab|c"));
  ASSERT_TRUE(deepest);
  expectWhole(deepest, R"("ab")");
  expectWhole(deepest, R"("c")");
  expectRefusedAt(deepest, R"("b")", 1);
  const std::string deep =
      "groups nested more than " + std::to_string(most) + " deep";
  EXPECT_NE(compileError(nested(most + 1, "a")).find(deep), std::string::npos);
  EXPECT_NE(compileError(nested(200000, "a")).find(deep), std::string::npos);
  // (?:...) groups count alike.
  std::string groups;
  for (int i = 0; i <= most; ++i)
    groups += "(?:";
  EXPECT_NE(compileError(R"({"pattern": ")" + groups + "a" +
                         std::string(most + 1, ')') + R"("})")
                .find(deep),
            std::string::npos);
  EXPECT_NE(
      compileError(R"({"pattern": "a)" + std::string(1000000, '*') + R"("})")
          .find("a quantifier after a quantifier"),
      std::string::npos);
}
