// Unit tests of the Jinja interpreter's pieces whose exact output matters: Python float/str
// printing, json.dumps formatting, whitespace control. (The golden tests in
// chat_template_test.cc cover the rest against transformers.)
#include <gtest/gtest.h>

#include "coordinator/chat/jinja_template.h"
#include "coordinator/chat/jinja_value.h"

namespace ringserve::chat::jinja {
namespace {

std::string Render(const std::string& source, Value::Dict vars = {}) {
  auto t = Template::Parse(source);
  if (!t.ok()) return "PARSE ERROR: " + std::string(t.status().message());
  auto out = (*t)->Render(vars, std::chrono::system_clock::time_point());
  if (!out.ok()) return "ERROR: " + std::string(out.status().message());
  return *out;
}

TEST(JinjaValueTest, FloatsPrintLikePythonRepr) {
  EXPECT_EQ(PyFloatRepr(1.0), "1.0");
  EXPECT_EQ(PyFloatRepr(0.1), "0.1");
  EXPECT_EQ(PyFloatRepr(1e-7), "1e-07");
  EXPECT_EQ(PyFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PyFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(PyFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PyFloatRepr(123456789.123), "123456789.123");
  EXPECT_EQ(PyFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(PyFloatRepr(5e-324), "5e-324");
  EXPECT_EQ(PyFloatRepr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(PyFloatRepr(0.1 + 0.2), "0.30000000000000004");
}

TEST(JinjaValueTest, IntsBeyond64BitsPrint) {
  EXPECT_EQ(IntToString(static_cast<Int>(12345678901234567890ull)), "12345678901234567890");
  EXPECT_EQ(IntToString(-42), "-42");
}

TEST(JinjaValueTest, JsonDumpsMatchesPython) {
  auto v = Value::FromJson(nlohmann::ordered_json::parse(
      R"({"b": [1, 2.5, null, true], "a": {}, "s": "é\"\\\n\u0001\u007f", "e": []})"));
  JsonDumpOptions plain;
  EXPECT_EQ(*JsonDumps(v, plain),
            "{\"b\": [1, 2.5, null, true], \"a\": {}, \"s\": \"é\\\"\\\\\\n\\u0001\x7f\", "
            "\"e\": []}");
  JsonDumpOptions indented;
  indented.indent = 2;
  EXPECT_EQ(*JsonDumps(v, indented),
            "{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": {},\n  \"s\": "
            "\"é\\\"\\\\\\n\\u0001\x7f\",\n  \"e\": []\n}");
  JsonDumpOptions ascii;
  ascii.ensure_ascii = true;
  EXPECT_EQ(*JsonDumps(Value::String("é🦙"), ascii), "\"\\u00e9\\ud83e\\udd99\"");
  EXPECT_FALSE(JsonDumps(Value(), plain).ok());  // undefined is not serializable
}

TEST(JinjaValueTest, ReprPicksQuotesAndEscapesLikePython) {
  EXPECT_EQ(PyReprString("it's"), "\"it's\"");
  EXPECT_EQ(PyReprString("both ' \""), "'both \\' \"'");
  EXPECT_EQ(PyReprString("\x01\n\xc2\xa0\xe2\x80\xa8 é"), "'\\x01\\n\\xa0\\u2028 é'");
}

TEST(JinjaTemplateTest, WhitespaceControlFollowsTransformersSettings) {
  // trim_blocks drops the newline after a block tag, lstrip_blocks the indent before it.
  EXPECT_EQ(Render("{% if true %}\n  A\n  {% endif %}\nB\n"), "  A\nB");
  EXPECT_EQ(Render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(Render("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(Render("{{ 'v' }}  {% if true %}x{% endif %}"), "v  x");  // not at line start
  EXPECT_EQ(Render("a\r\n{# c #}\r\nb"), "a\nb");
}

TEST(JinjaTemplateTest, OperatorPrecedenceIsJinjas) {
  EXPECT_EQ(Render("{{ -2 ** 2 }}|{{ -3|abs }}|{{ 2 * 3 ~ 4 }}"), "4|3|64");
  EXPECT_EQ(Render("{{ 1 + 2 ~ 3 }}"),  // 1 + (2 ~ 3): ~ binds tighter than +
            "ERROR: chat template error at line 1: unsupported operand type(s) for +: 'int' and "
            "'str'");
  EXPECT_EQ(Render("{{ not 1 == 2 }}|{{ 2 + 3 * 4 }}|{{ 'a' if false }}|"), "True|14||");
}

TEST(JinjaTemplateTest, LoopScopesAndNamespaces) {
  EXPECT_EQ(Render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}"
                   "{{ x }}"),
            "231");
  EXPECT_EQ(Render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
                   "{% endfor %}{{ ns.n }}"),
            "6");
}

TEST(JinjaTemplateTest, ErrorsNameTheLine) {
  EXPECT_EQ(Render("a\nb\n{{ x.y }}"), "ERROR: chat template error at line 3: 'x' is undefined");
  EXPECT_EQ(Render("{% for %}"),
            "PARSE ERROR: chat template syntax error at line 1: expected a variable name, got "
            "end of tag");
}

}  // namespace
}  // namespace ringserve::chat::jinja
