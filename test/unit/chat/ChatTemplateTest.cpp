//===- ChatTemplateTest.cpp - Kiln's Jinja subset, through the C++ API ----===//
//
// The Python suite (test/python/test_chat_template.py) compares hundreds of
// templates against jinja2 through kiln-chat-template; these cases check the
// library API itself: values built in C++, the context helper, the embedded
// GLM template, options, limits and error positions.
//
//===----------------------------------------------------------------------===//
#include "chat/ChatTemplate.h"
#include "chat/PyText.h"

#include <gtest/gtest.h>

using namespace kiln;
using namespace kiln::chat;

namespace {

Value message(std::string role, std::string content) {
  ValueMap map;
  map.set("role", Value(std::move(role)));
  map.set("content", Value(std::move(content)));
  return Value::map(std::move(map));
}

std::string render(std::string_view source, const Value &context,
                   TemplateOptions options = {}) {
  Expected<ChatTemplate> tmpl = ChatTemplate::parse(source, "test", options);
  EXPECT_TRUE(tmpl) << tmpl.error().message();
  if (!tmpl)
    return "<parse error>";
  Expected<std::string> text = tmpl->render(context);
  EXPECT_TRUE(text) << text.error().message();
  return text ? *text : "<render error>";
}

Value emptyContext() { return Value::map(ValueMap()); }

TEST(ChatTemplate, GlmDefaultTemplateRendersGlmFormat) {
  const Value context = chatContext(
      Value::list({message("system", "S"), message("user", "Hi"),
                   message("assistant", "Hello"), message("user", "Bye")}),
      /*addGenerationPrompt=*/true);
  EXPECT_EQ(render(glmDefaultTemplate(), context),
            "[gMASK]<sop><|system|>\nS<|user|>\nHi<|assistant|>\nHello"
            "<|user|>\nBye<|assistant|>");
}

TEST(ChatTemplate, GlmDefaultTemplateRejectsUnknownRoles) {
  Expected<ChatTemplate> tmpl = ChatTemplate::parse(glmDefaultTemplate(), "glm");
  ASSERT_TRUE(tmpl);
  Expected<std::string> text =
      tmpl->render(chatContext(Value::list({message("robot", "x")}), false));
  ASSERT_FALSE(text);
  EXPECT_NE(text.error().problem().find("unknown role 'robot'"), std::string::npos);
  EXPECT_EQ(text.error().where(), "glm");
}

TEST(ChatTemplate, SetInsideLoopDoesNotLeak) {
  EXPECT_EQ(render("{% set a = 0 %}{% for x in [1, 2, 3] %}{% set a = a + x %}"
                   "{{ a }}{% endfor %}|{{ a }}",
                   emptyContext()),
            "123|0");
  EXPECT_EQ(render("{% if true %}{% set a = 5 %}{% endif %}{{ a }}", emptyContext()),
            "5");
}

TEST(ChatTemplate, TrimAndLstripOptions) {
  const std::string_view source = "  {% if true %}\n  x\n  {% endif %}\ny\n";
  EXPECT_EQ(render(source, emptyContext()), "  x\ny");
  TemplateOptions jinjaDefaults;
  jinjaDefaults.trimBlocks = false;
  jinjaDefaults.lstripBlocks = false;
  EXPECT_EQ(render(source, emptyContext(), jinjaDefaults), "  \n  x\n  \ny");
  TemplateOptions keep;
  keep.keepTrailingNewline = true;
  EXPECT_EQ(render(source, emptyContext(), keep), "  x\ny\n");
}

TEST(ChatTemplate, PrintsValuesAsPython) {
  ValueMap map;
  map.set("a", Value::list({Value::integer(1), Value::number(2.5), Value::none(),
                            Value::boolean(true), Value("it's")}));
  ValueMap context;
  context.set("d", Value::map(std::move(map)));
  EXPECT_EQ(render("{{ d }}|{{ d | tojson }}", Value::map(std::move(context))),
            "{'a': [1, 2.5, None, True, \"it's\"]}|"
            "{\"a\": [1, 2.5, null, true, \"it's\"]}");
}

TEST(ChatTemplate, ParseErrorsNameLineAndColumn) {
  Expected<ChatTemplate> tmpl =
      ChatTemplate::parse("ok\n  {% call m() %}{% endcall %}", "t.jinja");
  ASSERT_FALSE(tmpl);
  EXPECT_EQ(tmpl.error().where(), "t.jinja");
  EXPECT_EQ(tmpl.error().field(), "line 2, column 6");
  EXPECT_NE(tmpl.error().problem().find("unsupported"), std::string::npos);
  EXPECT_EQ(tmpl.error().message().rfind("t.jinja: line 2, column 6: ", 0), 0u);

  tmpl = ChatTemplate::parse("{{ x | nope }}", "t");
  ASSERT_FALSE(tmpl);
  EXPECT_EQ(tmpl.error().field(), "line 1, column 6");

  tmpl = ChatTemplate::parse("{% for x in y %}", "t");
  ASSERT_FALSE(tmpl);
  EXPECT_NE(tmpl.error().problem().find("endfor"), std::string::npos);
}

TEST(ChatTemplate, RenderErrors) {
  Expected<ChatTemplate> tmpl =
      ChatTemplate::parse("a\n{{ raise_exception('no ' ~ 'way') }}", "t");
  ASSERT_TRUE(tmpl);
  Expected<std::string> text = tmpl->render(emptyContext());
  ASSERT_FALSE(text);
  EXPECT_EQ(text.error().field(), "line 2, column 4");
  EXPECT_EQ(text.error().problem(), "raise_exception: no way");

  text = tmpl->render(Value::list({}));
  ASSERT_FALSE(text);
  EXPECT_NE(text.error().problem().find("map"), std::string::npos);
}

TEST(ChatTemplate, LimitsAreErrors) {
  Expected<ChatTemplate> tmpl =
      ChatTemplate::parse("{% for i in range(100) %}{{ i }}{% endfor %}", "t");
  ASSERT_TRUE(tmpl);
  RenderLimits small;
  small.maxOutputBytes = 50;
  Expected<std::string> text = tmpl->render(emptyContext(), small);
  ASSERT_FALSE(text);
  EXPECT_NE(text.error().problem().find("output longer"), std::string::npos);
  RenderLimits few;
  few.maxLoopIterations = 10;
  text = tmpl->render(emptyContext(), few);
  ASSERT_FALSE(text);
  EXPECT_NE(text.error().problem().find("loop iterations"), std::string::npos);
}

TEST(ChatTemplate, TooDeepValuesAreRefused) {
  Value deep = Value::integer(1);
  for (uint32_t i = 0; i < kMaxNestingDepth + 5; ++i)
    deep = Value::list({deep});
  ValueMap context;
  context.set("x", deep);
  Expected<ChatTemplate> tmpl = ChatTemplate::parse("{{ x }}", "t");
  ASSERT_TRUE(tmpl);
  EXPECT_FALSE(tmpl->render(Value::map(std::move(context))));
}

TEST(PyText, FloatsPrintAsPython) {
  EXPECT_EQ(pytext::formatFloat(1.0), "1.0");
  EXPECT_EQ(pytext::formatFloat(0.1), "0.1");
  EXPECT_EQ(pytext::formatFloat(1e16), "1e+16");
  EXPECT_EQ(pytext::formatFloat(1e15), "1000000000000000.0");
  EXPECT_EQ(pytext::formatFloat(1e-5), "1e-05");
  EXPECT_EQ(pytext::formatFloat(0.0001), "0.0001");
  EXPECT_EQ(pytext::formatFloat(-2.5e-10), "-2.5e-10");
  EXPECT_EQ(pytext::formatFloat(-0.0), "-0.0");
  EXPECT_EQ(pytext::formatFloat(1.0 / 3), "0.3333333333333333");
}

TEST(PyText, CaseMappingAsPython) {
  EXPECT_EQ(pytext::lower("ΣΑΣ ΟΔΟΣ"), "σας οδος");
  EXPECT_EQ(pytext::upper("straße"), "STRASSE");
  EXPECT_EQ(pytext::capitalize("ǆemal"), "ǅemal");
  EXPECT_EQ(pytext::lower("İ"), "i\xcc\x87");
  EXPECT_EQ(pytext::strip("\xe3\x80\x80 a \xc2\xa0", std::nullopt, true, true), "a");
}

TEST(PyText, ReprAndJsonQuoting) {
  EXPECT_EQ(pytext::repr("it's"), "\"it's\"");
  EXPECT_EQ(pytext::repr("a\n\x01\xc2\xa0"), "'a\\n\\x01\\xa0'");
  EXPECT_EQ(pytext::jsonQuote("\xc3\xa9\"\x01", false), "\"\xc3\xa9\\\"\\u0001\"");
  EXPECT_EQ(pytext::jsonQuote("\xf0\x9f\x98\x80", true), "\"\\ud83d\\ude00\"");
}

} // namespace

TEST(ChatTemplate, ReadsVariableFindsEveryUse) {
  auto reads = [](std::string_view source) {
    Expected<ChatTemplate> t = ChatTemplate::parse(source, "test");
    EXPECT_TRUE(t) << (t ? "" : t.error().message());
    return t && t->readsVariable("tools");
  };
  EXPECT_TRUE(reads("{{ tools }}"));
  EXPECT_TRUE(reads("{% for t in tools %}{% endfor %}"));
  EXPECT_TRUE(reads("{% if x %}{% elif tools | length %}{% endif %}"));
  EXPECT_TRUE(reads("{% macro m(a=tools) %}{% endmacro %}"));
  EXPECT_TRUE(reads("{% macro m() %}{{ f(x=[tools]) }}{% endmacro %}"
                    "{% macro f(x) %}{% endmacro %}"));
  EXPECT_TRUE(reads("{% for x in xs if tools %}{% else %}{% endfor %}"));
  EXPECT_FALSE(reads("{{ 'tools' }}{{ m.tools }}{% set t = 1 %}"));
  EXPECT_FALSE(reads(""));
  Expected<ChatTemplate> glm = ChatTemplate::parse(glmDefaultTemplate(), "glm");
  ASSERT_TRUE(glm);
  EXPECT_TRUE(glm->readsVariable("tools"));
  EXPECT_FALSE(glm->readsVariable("enable_thinking"));
}
