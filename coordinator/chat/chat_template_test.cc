// Checks ChatTemplate against golden strings rendered by transformers' apply_chat_template
// (tests/fixtures/chat/goldens.json, made by scripts/make_chat_goldens.py on the device).
#include "coordinator/chat/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ringserve::chat {
namespace {

using nlohmann::ordered_json;

std::string SourceDir() {
  const char* d = std::getenv("RINGSERVE_SOURCE_DIR");
  return d ? d : ".";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ordered_json ReadJson(const std::string& rel) {
  return ordered_json::parse(ReadFile(SourceDir() + "/" + rel));
}

std::string TokenizerDir(const std::string& name) {
  return SourceDir() + "/.deps/tokenizers/" + name;
}

// Template name in goldens.json -> ChatTemplate. llama3_1 is our Llama 3.1-style fixture
// template rendered with the llama3 tokenizer's special tokens.
absl::StatusOr<ChatTemplate> LoadTemplate(const std::string& name) {
  if (name != "llama3_1") return ChatTemplate::FromTokenizerConfig(TokenizerDir(name));
  auto base = ChatTemplate::FromTokenizerConfig(TokenizerDir("llama3"));
  if (!base.ok()) return base.status();
  return ChatTemplate::FromString(
      ReadFile(SourceDir() + "/tests/fixtures/chat/llama3_1_chat_template.jinja"),
      base->special_tokens());
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// "" when equal, else where and how they differ.
std::string Diff(const std::string& want, const std::string& got) {
  if (want == got) return "";
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  size_t b = i > 40 ? i - 40 : 0;
  return "first difference at byte " + std::to_string(i) + "\n  want: ..." +
         Escape(want.substr(b, 100)) + "\n  got:  ..." + Escape(got.substr(b, 100));
}

// Case options; `template_kwargs` (per template, from conversations.json) go under the case's.
ChatRenderOptions OptionsFor(const ordered_json& c,
                             const ordered_json& template_kwargs = ordered_json::object()) {
  ChatRenderOptions o;
  o.add_generation_prompt = c.value("add_generation_prompt", false);
  if (c.contains("tools")) o.tools = c["tools"];
  o.extra_kwargs = template_kwargs;
  if (c.contains("kwargs")) o.extra_kwargs.update(c["kwargs"]);
  o.now = std::chrono::system_clock::from_time_t(1785000000);
  return o;
}

const ordered_json* FindCase(const ordered_json& list, const std::string& name) {
  for (const auto& c : list) {
    if (c["name"] == name) return &c;
  }
  return nullptr;
}

// Compares one rendered result (or error) with its golden row.
void ExpectMatchesGolden(const std::string& what, const absl::StatusOr<std::string>& got,
                         const ordered_json& golden, int* checked) {
  ++*checked;
  if (golden.contains("error")) {
    EXPECT_FALSE(got.ok()) << what << ": transformers raised " << golden["error"] << " ("
                           << golden["message"] << ") but we rendered:\n"
                           << *got;
    return;
  }
  ASSERT_TRUE(got.ok()) << what << ": " << got.status();
  std::string diff = Diff(golden["rendered"].get<std::string>(), *got);
  EXPECT_TRUE(diff.empty()) << what << ": " << diff;
}

TEST(ChatTemplateGoldenTest, GoldensComeFromTransformers) {
  ordered_json goldens = ReadJson("tests/fixtures/chat/goldens.json");
  std::string version = goldens["generator"]["transformers"].get<std::string>();
  EXPECT_EQ(version.rfind("none", 0), std::string::npos)
      << "goldens.json must be rendered by transformers, not emulated";
}

TEST(ChatTemplateGoldenTest, ConversationsRenderLikeTransformers) {
  ordered_json goldens = ReadJson("tests/fixtures/chat/goldens.json");
  ordered_json conversations = ReadJson("tests/fixtures/chat/conversations.json");
  const ordered_json& cases = conversations["cases"];
  int checked = 0;
  for (const auto& [tname, rows] : goldens["conversations"].items()) {
    ordered_json template_kwargs =
        conversations["template_kwargs"].value(tname, ordered_json::object());
    auto tmpl = LoadTemplate(tname);
    ASSERT_TRUE(tmpl.ok()) << tname << ": " << tmpl.status();
    EXPECT_GE(rows.size(), 15u) << tname;
    for (const auto& row : rows) {
      const ordered_json* c = FindCase(cases, row["name"]);
      ASSERT_NE(c, nullptr) << row["name"];
      auto got = tmpl->Render((*c)["messages"], OptionsFor(*c, template_kwargs));
      ExpectMatchesGolden(tname + "/" + row["name"].get<std::string>(), got, row, &checked);
    }
  }
  EXPECT_GE(checked, 60);
}

TEST(ChatTemplateGoldenTest, JinjaFeatureSnippetsRenderLikeTransformers) {
  ordered_json goldens = ReadJson("tests/fixtures/chat/goldens.json");
  ordered_json snippets = ReadJson("tests/fixtures/chat/snippets.json")["snippets"];
  auto llama = ChatTemplate::FromTokenizerConfig(TokenizerDir("llama3"));
  ASSERT_TRUE(llama.ok()) << llama.status();
  int checked = 0;
  for (const auto& row : goldens["snippets"]) {
    const ordered_json* s = FindCase(snippets, row["name"]);
    ASSERT_NE(s, nullptr) << row["name"];
    auto tmpl = ChatTemplate::FromString((*s)["template"], llama->special_tokens());
    absl::StatusOr<std::string> got = tmpl.ok() ? tmpl->Render((*s)["messages"], OptionsFor(*s))
                                                : absl::StatusOr<std::string>(tmpl.status());
    ExpectMatchesGolden("snippet " + row["name"].get<std::string>(), got, row, &checked);
  }
  EXPECT_GE(checked, 40);
}

// The goldens must catch a one-literal change in a real template.
TEST(ChatTemplateGoldenTest, ChangedTemplateLiteralFailsGolden) {
  ordered_json goldens = ReadJson("tests/fixtures/chat/goldens.json");
  ordered_json cases = ReadJson("tests/fixtures/chat/conversations.json")["cases"];
  auto qwen = ChatTemplate::FromTokenizerConfig(TokenizerDir("qwen3"));
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  std::string source = qwen->source();
  const std::string literal = "\\n</tool_response>";
  size_t at = source.find(literal);
  ASSERT_NE(at, std::string::npos);
  source.replace(at, literal.size(), "\\n</tool_result>");
  auto changed = ChatTemplate::FromString(source, qwen->special_tokens());
  ASSERT_TRUE(changed.ok()) << changed.status();
  const ordered_json* row = FindCase(goldens["conversations"]["qwen3"], "qwen_tool_flow");
  ASSERT_NE(row, nullptr);
  const ordered_json* c = FindCase(cases, "qwen_tool_flow");
  auto original = qwen->Render((*c)["messages"], OptionsFor(*c));
  auto modified = changed->Render((*c)["messages"], OptionsFor(*c));
  ASSERT_TRUE(original.ok() && modified.ok());
  EXPECT_EQ(Diff((*row)["rendered"], *original), "");
  EXPECT_NE(Diff((*row)["rendered"], *modified), "");
}

void ExpectError(const std::string& source, const std::string& fragment, bool at_parse) {
  auto tmpl = ChatTemplate::FromString(source);
  absl::Status status = tmpl.status();
  if (tmpl.ok()) {
    EXPECT_FALSE(at_parse) << source << " parsed";
    ChatRenderOptions options;
    options.extra_kwargs = {{"x", 1}};
    status = tmpl->Render(ordered_json::array({{{"role", "user"}, {"content", "hi"}}}), options)
                 .status();
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << source;
  EXPECT_NE(std::string(status.message()).find(fragment), std::string::npos)
      << source << " -> " << status;
}

// transformers 5 saves a tokenizer's chat template as <dir>/chat_template.jinja (not in
// tokenizer_config.json); that file takes precedence, the special tokens still come from the
// config, and a directory with only the .jinja file works too.
TEST(ChatTemplateTest, ChatTemplateJinjaFileTakesPrecedence) {
  const std::string dir = ::testing::TempDir() + "/rs_chat_jinja_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  std::ofstream(dir + "/chat_template.jinja")
      << "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}";
  {
    auto only_jinja = ChatTemplate::FromTokenizerConfig(dir);
    ASSERT_TRUE(only_jinja.ok()) << only_jinja.status();
    auto text = only_jinja->Render(messages, {});
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, "[user] hi");  // no config: bos_token undefined, renders empty
  }
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"bos_token": "<s>", "chat_template": "config template {{ messages }}"})";
  auto both = ChatTemplate::FromTokenizerConfig(dir);
  ASSERT_TRUE(both.ok()) << both.status();
  auto text = both->Render(messages, {});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<s>[user] hi");
  // The config file itself, named directly, is read as before.
  auto config_only = ChatTemplate::FromTokenizerConfig(dir + "/tokenizer_config.json");
  ASSERT_TRUE(config_only.ok()) << config_only.status();
  EXPECT_EQ(config_only->source(), "config template {{ messages }}");
  std::filesystem::remove_all(dir);
}

TEST(ChatTemplateTest, UnsupportedConstructsGiveClearErrors) {
  ExpectError("a\n{% include 'other.jinja' %}", "line 2: unsupported construct: tag 'include'",
              true);
  ExpectError("{% extends 'base' %}", "unsupported construct: tag 'extends'", true);
  ExpectError("{% call foo() %}x{% endcall %}", "unsupported construct: tag 'call'", true);
  ExpectError("{% for m in messages recursive %}{% endfor %}", "recursive for loops", true);
  ExpectError("\n\n{{ 'a' | wordwrap(3) }}",
              "line 3: unsupported construct: no filter named "
              "'wordwrap'",
              true);
  ExpectError("{% for m in [] %}{{ x is prime }}{% endfor %}", "no test named 'prime'", true);
  // Inside {% if %}, Jinja reports unknown filters only when they run.
  ExpectError("{% if x %}\n{{ 'a' | wordwrap(3) }}{% endif %}",
              "line 2: unsupported construct: no filter named 'wordwrap'", false);
  ExpectError("{{ f(*args) }}", "*args", true);
  ExpectError("{{ '{}'.format(1) }}", "unsupported string method 'format'", false);
  ExpectError("{{ '%s' % 'a' }}", "printf-style", false);
  ExpectError("{% if x %}\n{{ raise_exception('Only user/assistant roles!') }}{% endif %}",
              "raised an exception at line 2: Only user/assistant roles!", false);
  ExpectError("{{ messages[0].content.nope.deeper }}", "has no attribute 'nope'", false);
  ExpectError("{{ 'a' + x }}", "can only concatenate str (not \"int\") to str", false);
  ExpectError("{% if true %}unclosed", "expected 'elif' or 'else' or 'endif'", true);
  ExpectError("{{ 1 + }}", "unexpected end of tag", true);
  ExpectError("{{ 'unterminated }}", "unterminated string literal", true);
  ExpectError("{% endfor %}", "unexpected 'endfor' tag", true);
  ExpectError("{{ range(1000000)|length }}", "Range too big", false);
}

TEST(ChatTemplateTest, DeeplyNestedValuesAreRefusedNotRecursed) {
  auto tmpl = ChatTemplate::FromString("{{ messages | tojson }}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  // Far deeper than any real conversation (the limit is kMaxJsonDepth).
  ordered_json deep = "leaf";
  for (int i = 0; i < 5000; ++i) {
    ordered_json wrapper = ordered_json::array();
    wrapper.push_back(std::move(deep));
    deep = std::move(wrapper);
  }
  ordered_json messages = ordered_json::array({{{"role", "user"}, {"content", deep}}});
  absl::StatusOr<std::string> rendered = tmpl->Render(messages, {});
  EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(rendered.status().message()).find("nested deeper"), std::string::npos)
      << rendered.status();
  ChatRenderOptions options;
  options.extra_kwargs = {{"x", deep}};
  ordered_json shallow = ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_FALSE(tmpl->Render(shallow, options).ok());
  EXPECT_TRUE(tmpl->Render(shallow, {}).ok());
}

std::string Times(const std::string& s, int n) {
  std::string out;
  out.reserve(s.size() * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(ChatTemplateTest, DeeplyNestedTemplatesAreRefusedAtLoad) {
  const std::string kDeep = "nested deeper than 256 levels";
  // Recursive-descent nesting (would overflow the parser's stack).
  ExpectError("{{ " + Times("(", 20000) + "1" + Times(")", 20000) + " }}", kDeep, true);
  ExpectError(Times("{% if true %}", 20000) + "x" + Times("{% endif %}", 20000), kDeep, true);
  ExpectError(Times("{% for i in x %}", 20000) + Times("{% endfor %}", 20000), kDeep, true);
  ExpectError("{{ " + Times("[", 20000) + Times("]", 20000) + " }}", kDeep, true);
  ExpectError("{{ " + Times("{'a': ", 20000) + "1" + Times("}", 20000) + " }}", kDeep, true);
  ExpectError("{{ " + Times("not ", 40000) + "true }}", kDeep, true);
  ExpectError("{{ " + Times("-", 40000) + "1 }}", kDeep, true);
  ExpectError("{{ " + Times("1 if x else ", 20000) + "2 }}", kDeep, true);
  ExpectError("{{ " + Times("f(", 20000) + Times(")", 20000) + " }}", kDeep, true);
  // Chains parsed by loops build deep trees (would overflow rendering and destruction).
  ExpectError("{{ 'a'" + Times("|upper", 40000) + " }}", kDeep, true);
  ExpectError("{{ messages" + Times("[0]", 40000) + " }}", kDeep, true);
  ExpectError("{{ messages" + Times(".a", 40000) + " }}", kDeep, true);
  ExpectError("{{ f" + Times("()", 40000) + " }}", kDeep, true);
  ExpectError("{{ 1" + Times(" + 1", 40000) + " }}", kDeep, true);
  ExpectError("{{ 'a'" + Times(" ~ 'a'", 40000) + " }}", kDeep, true);
  ExpectError("{{ x" + Times(" is defined", 1) + Times(" and x", 40000) + " }}", kDeep, true);
  // The error names the line; the tokenizer_config path is added by FromTokenizerConfig.
  ExpectError("\n{{ " + Times("(", 1000) + "1" + Times(")", 1000) + " }}", "syntax error at line 2",
              true);
  // Nesting below the limit still works.
  const ordered_json messages = ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  for (const auto& [source, want] : std::vector<std::pair<std::string, std::string>>{
           {"{{ " + Times("(", 200) + "1" + Times(")", 200) + " }}", "1"},
           {"{{ 'a'" + Times("|upper", 200) + " }}", "A"},
           {"{{ " + Times("not ", 200) + "true }}", "True"},
           {Times("{% if true %}", 200) + "x" + Times("{% endif %}", 200), "x"},
           {"{{ messages[0].content" + Times("|string", 200) + " }}", "hi"}}) {
    auto tmpl = ChatTemplate::FromString(source);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    auto rendered = tmpl->Render(messages, {});
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(*rendered, want);
  }
}

TEST(ChatTemplateTest, RenderBudgetStopsRunawayTemplates) {
  // Loops and exponential recursion run out of steps instead of hanging.
  // (With a small budget to keep the test fast; the default is 10 million steps.)
  const ordered_json messages = ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  ChatRenderOptions small_budget;
  small_budget.max_render_steps = 100000;
  for (const char* source :
       {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
        "{{ f(60) }}"}) {
    auto tmpl = ChatTemplate::FromString(source);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    auto rendered = tmpl->Render(messages, small_budget);
    EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument) << source;
    EXPECT_NE(std::string(rendered.status().message()).find("render exceeds 100000 steps"),
              std::string::npos)
        << rendered.status();
  }
  // Macro recursion times deep expressions is bounded too (stack overflow otherwise).
  ExpectError("{% macro f(n) %}{{ (f(n - 1) if n > 0 else '')" + Times(" ~ ''", 200) +
                  " }}{% endmacro %}{{ f(60) }}",
              "render nested deeper than 1024 levels", false);
  // Results that would exhaust memory fail at the size checks.
  ExpectError("{{ range(100000)|join(',' * 100000) }}", "join result too large", false);
  ExpectError("{{ (',' * 100000).join(range(100000)|map('string')) }}", "join result too large",
              false);
  ExpectError(
      "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
      "{% endfor %}{{ ns.l|length }}",
      "list concatenation result too large", false);
  ExpectError(
      "{% set ns = namespace(s='aa') %}{% for i in range(64) %}"
      "{% set ns.s = ns.s|replace('a', ns.s) %}{% endfor %}{{ ns.s|length }}",
      "replace result too large", false);
  ExpectError(
      "{% set ns = namespace(s='a' * 300) %}{% for i in range(64) %}"
      "{% set ns.s = ns.s.replace('', ns.s) %}{% endfor %}{{ ns.s|length }}",
      "replace result too large", false);
  ExpectError(
      "{% set ns = namespace(s='a') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}",
      "string too large", false);
  ExpectError(
      "{% set ns = namespace(s='a') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}",
      "string too large", false);
  ExpectError("{{ 'a'|center(10000000000) }}", "center result too large", false);
  ExpectError("{{ ('a\n' * 100000)|indent('x' * 1000) }}", "indent result too large", false);
}

// `prelude` followed by `{% set l = [l, l] %}` 40 times: 41 list nodes, 2^40 leaves.
std::string Doubled(const std::string& prelude = "{% set l = [1] %}") {
  return prelude + Times("{% set l = [l, l] %}", 40);
}

absl::Status RenderStatus(const std::string& source, const ChatRenderOptions& options) {
  auto tmpl = ChatTemplate::FromString(source);
  if (!tmpl.ok()) return tmpl.status();
  return tmpl->Render(ordered_json::array({{{"role", "user"}, {"content", "hi"}}}), options)
      .status();
}

TEST(ChatTemplateTest, ValuesSharedManyTimesFailWithinTheBudget) {
  // A value built by nesting one list in another shares it (41 nodes here), but printing,
  // dumping or comparing it visits every path: each visit is charged, so these fail in a
  // bounded time instead of building 2^40 leaves. (A small step budget keeps the test fast.)
  ChatRenderOptions options;
  options.max_render_steps = 1'000'000;
  const std::string kSteps = "render exceeds 1000000 steps";
  const std::string kNsDoubled =
      "{% set ns = namespace(l=[1], d={}, a=[1], b=[1]) %}{% for i in range(40) %}"
      "{% set ns.l = [ns.l, ns.l] %}{% set ns.d = {'x': ns.d, 'y': ns.d} %}"
      "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}";
  for (const std::string& source : {
           Doubled() + "{{ l }}",
           Doubled() + "{% set s = l|string %}",
           Doubled() + "{% set s = l|tojson %}",
           Doubled() + "{% set s = l ~ '' %}",
           Doubled() + "{{ l|join(',')|length }}",
           Doubled() + "{{ l|map('string')|list|length }}",
           Doubled() + "{{ {'k': l}|items|list }}",
           Doubled() + "{{ l|upper|length }}",
           kNsDoubled + "{{ ns.l|length }}{{ ns.l }}",
           kNsDoubled + "{{ ns.d|tojson|length }}",
           kNsDoubled + "{{ ns.d }}",
           kNsDoubled + "{{ ns }}",
           // Two lists built alike but apart: comparing them walks both.
           kNsDoubled + "{{ ns.a == ns.b }}",
           kNsDoubled + "{{ [ns.a, ns.b]|sort|length }}",
           kNsDoubled + "{{ ns.a in [ns.b] }}",
           kNsDoubled + "{{ [ns.a, ns.b]|unique|list|length }}",
       }) {
    absl::Status status = RenderStatus(source, options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << source;
    EXPECT_NE(std::string(status.message()).find(kSteps), std::string::npos)
        << source << " -> " << status;
    EXPECT_EQ(std::string(status.message()).rfind("chat template error at line 1", 0), 0u)
        << status;
  }
  // Indented, the dump reaches the size cap first.
  absl::Status indented = RenderStatus(kNsDoubled + "{{ ns.d|tojson(indent=2)|length }}", options);
  EXPECT_NE(std::string(indented.message()).find("tojson result too large (over 64 MiB)"),
            std::string::npos)
      << indented;
  // Comparing a shared list with itself is cheap, as in Python (identity first).
  auto same = ChatTemplate::FromString(Doubled() + "{{ l == l }} {{ [l, 1] == [l, 1] }}");
  ASSERT_TRUE(same.ok());
  auto rendered = same->Render(ordered_json::array({{{"role", "user"}, {"content", "hi"}}}), {});
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered, "True True");
}

TEST(ChatTemplateTest, ValuesBuiltInLoopsFailWithinTheBudget) {
  ChatRenderOptions options;  // smaller budgets than the default keep the test fast
  options.max_render_steps = 1'000'000;
  options.max_render_bytes = 128 << 20;
  const std::string kBytes = "render builds more than 128 MiB of values";
  const std::string kSteps = "render exceeds 1000000 steps";
  struct Case {
    std::string source;
    std::string error;
  };
  const Case cases[] = {
      // Each string is under the 64 MiB cap; together they are not.
      {"{% for i in range(1000) %}{% set s = 'a' * 60000000 %}{% endfor %}", kBytes},
      {"{% set ns = namespace(s='') %}{% for i in range(100000) %}"
       "{% set ns.s = ns.s ~ ('x' * 1000) %}{% endfor %}",
       kBytes},
      {"{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
       "{% set ns.l = ns.l + ['x' * 1000] %}{% endfor %}",
       kBytes},
      {"{% macro m() %}{{ 'a' * 60000000 }}{% endmacro %}{% for i in range(1000) %}"
       "{% set s = m() %}{% endfor %}",
       kBytes},
      {"{% for i in range(1000) %}{% set s %}{{ 'a' * 60000000 }}{% endset %}{% endfor %}", kBytes},
      // A string's characters become values (about 100 bytes each).
      {"{% for i in range(1000) %}{% set l = ('ab' * 1000000)|list %}{% endfor %}", kBytes},
      {"{% for i in range(1000) %}{% for c in 'ab' * 1000000 %}{% break %}{% endfor %}"
       "{% endfor %}",
       kBytes},
      {"{{ ([[1] * 1000] * 100000)|sum(start=[])|length }}", kBytes},
      {"{% set d = {'a': 'x' * 60000000} %}{% for i in range(1000) %}"
       "{% set l = d|items|list %}{% set s = d.a ~ '' %}{% endfor %}",
       kBytes},
      // Reading a long string costs a step per 256 bytes.
      {"{% set s = 'a' * 60000000 %}{% for i in range(100000) %}{% if s|length %}{% endif %}"
       "{% endfor %}",
       kSteps},
      {"{% set s = 'a' * 60000000 %}{% for i in range(100000) %}{% if 'b' in s %}{% endif %}"
       "{% endfor %}",
       kSteps},
      {"{% set s = 'a' * 60000000 %}{% for i in range(100000) %}{% if s[0] == s[-1] %}{% endif %}"
       "{% endfor %}",
       kBytes},
      // Dict keys are copies too; a long key costs its length to compare; an Undefined's hint
      // (what was looked up) keeps only its start.
      {"{% set k = 'a' * 60000000 %}{% set ns = namespace(l=[]) %}{% for i in range(2000) %}"
       "{% set ns.l = ns.l + [{k: i}] %}{% endfor %}",
       kBytes},
      {"{% set d = {'a' * 20000000 ~ 'x': 1} %}{% set k = 'a' * 20000000 ~ 'y' %}"
       "{% for i in range(100000) %}{% if k in d %}{% endif %}{% endfor %}",
       kSteps},
      // A search compares up to the product of the lengths.
      {"{{ ('a' * 60000000).find('a' * 30000000 ~ 'b') }}", kSteps},
      {"{{ 'a' * 10000000 ~ 'b' in 'a' * 20000000 }}", kSteps},
      {"{{ ('a' * 60000000).replace('a' * 30000000 ~ 'b', '') }}", kSteps},
      {"{{ ('a' * 60000000).split('a' * 30000000 ~ 'b') }}", kSteps},
      // Nesting grown one level an iteration (printing, comparing and freeing it recurse).
      {"{% set ns = namespace(l=1) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}"
       "{% endfor %}{{ ns.l }}",
       "value nested deeper than 256 levels"},
      {"{% set ns = namespace(d=1) %}{% for i in range(100000) %}{% set ns.d = {'a': ns.d} %}"
       "{% endfor %}{{ ns.d|tojson }}",
       "value nested deeper than 256 levels"},
      // A namespace that holds itself (or a loop object) would print forever.
      {"{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}",
       "a namespace attribute cannot hold a namespace"},
      {"{% set ns = namespace() %}{% set ns.l = [1, {'a': ns}] %}{{ ns }}",
       "a namespace attribute cannot hold a namespace"},
      {"{% set ns = namespace() %}{% for x in [1] %}{% set ns.loop = loop %}{% endfor %}",
       "a namespace attribute cannot hold a namespace"},
      {"{% set ns = namespace() %}{% set ns.get = {'n': ns}.get %}{{ ns }}",
       "a namespace attribute cannot hold a namespace"},
      // Single values over the caps, as before.
      {"{{ ('a' * 10**9)|length }}", "string repetition result too large"},
      {"{{ range(10**9)|list|length }}", "Range too big"},
  };
  for (const Case& c : cases) {
    absl::Status status = RenderStatus(c.source, options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.source;
    EXPECT_NE(std::string(status.message()).find(c.error), std::string::npos)
        << c.source << " -> " << status;
  }
  // A miss's Undefined keeps only the start of the key it names: 500 misses of a 60 MB key
  // hold no 500 copies of it (30 GB).
  auto misses = ChatTemplate::FromString(
      "{% set k = 'a' * 60000000 %}{% set ns = namespace(l=[]) %}{% for i in range(500) %}"
      "{% set ns.l = ns.l + [{}[k]] %}{% endfor %}{{ ns.l|length }}");
  ASSERT_TRUE(misses.ok());
  auto held = misses->Render(ordered_json::array({{{"role", "user"}, {"content", "hi"}}}), options);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, "500");
  // Repeating an empty sequence any number of times is empty, at once.
  auto empty = ChatTemplate::FromString("{{ ('' * 10**30)|length }}{{ ([] * 10**30)|length }}");
  ASSERT_TRUE(empty.ok());
  auto rendered = empty->Render(ordered_json::array({{{"role", "user"}, {"content", "hi"}}}), {});
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered, "00");
}

TEST(ChatTemplateTest, RenderBudgetIsPerRender) {
  // A render that spends its budget fails alone: renders of the same template on other threads
  // at the same time, and later ones on the same thread, get their own budget.
  auto tmpl = ChatTemplate::FromString("{% if messages[0].content == 'explode' %}" + Doubled() +
                                       "{{ l }}{% else %}{% for m in messages %}<{{ m.role }}>{{ "
                                       "m.content }}{% endfor %}{% endif %}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const ordered_json hostile = ordered_json::array({{{"role", "user"}, {"content", "explode"}}});
  const ordered_json normal = ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  std::atomic<int> failures = 0;
  std::thread attacker([&] {
    for (int i = 0; i < 3; ++i) failures += !tmpl->Render(hostile, {}).ok();
  });
  for (int i = 0; i < 200; ++i) {
    auto out = tmpl->Render(normal, {});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, "<user>hi");
  }
  attacker.join();
  EXPECT_EQ(failures, 3);
  // The default steps and bytes leave real templates far from their limits: a 4 MB
  // conversation of 1,000 messages renders with a budget a tenth of the default.
  ordered_json long_chat = ordered_json::array();
  for (int i = 0; i < 1000; ++i) {
    long_chat.push_back({{"role", i % 2 ? "assistant" : "user"},
                         {"content", std::string(4000, 'x') + (i % 2 ? "<think>r</think>y" : "")}});
  }
  ChatRenderOptions tenth;
  tenth.add_generation_prompt = true;
  tenth.max_render_steps = 1'000'000;
  tenth.max_render_bytes = 51 << 20;
  for (const char* name : {"qwen3", "llama3", "deepseek_v3"}) {
    auto real = ChatTemplate::FromTokenizerConfig(TokenizerDir(name));
    ASSERT_TRUE(real.ok()) << real.status();
    auto out = real->Render(long_chat, tenth);
    EXPECT_TRUE(out.ok()) << name << ": " << out.status();
  }
}

TEST(ChatTemplateTest, TruncatedAndMutatedTemplatesNeverCrash) {
  ordered_json messages =
      ReadJson("tests/fixtures/chat/conversations.json")["cases"][3]["messages"];
  ChatRenderOptions options;
  options.add_generation_prompt = true;
  int parsed = 0;
  int failed = 0;
  std::mt19937 rng(12345);
  for (const char* name : {"qwen3", "llama3", "deepseek_v3"}) {
    auto full = ChatTemplate::FromTokenizerConfig(TokenizerDir(name));
    ASSERT_TRUE(full.ok()) << full.status();
    const std::string& src = full->source();
    std::vector<std::string> variants;
    for (size_t len = 0; len < src.size(); len += 7) variants.push_back(src.substr(0, len));
    static const char kNoise[] = "{}%#-+|()[]'\".,:~ \nxif";
    for (int i = 0; i < 300; ++i) {
      std::string m = src;
      m[rng() % m.size()] = kNoise[rng() % (sizeof(kNoise) - 1)];
      variants.push_back(std::move(m));
    }
    for (const std::string& v : variants) {
      auto t = ChatTemplate::FromString(v, full->special_tokens());
      absl::Status st = t.status();
      if (t.ok()) {
        ++parsed;
        st = t->Render(messages, options).status();
      }
      if (!st.ok()) {
        ++failed;
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
        EXPECT_EQ(std::string(st.message()).rfind("chat template", 0), 0u) << st;
      }
    }
  }
  EXPECT_GT(parsed, 50);
  EXPECT_GT(failed, 50);
}

TEST(ChatTemplateTest, StrftimeNowUsesTheInjectedClockInUtc) {
  auto tmpl = ChatTemplate::FromString("{{ strftime_now('%d %b %Y %H:%M') }}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  ChatRenderOptions options;
  options.now = std::chrono::system_clock::from_time_t(1721995200);  // 2024-07-26 12:00 UTC
  auto out = tmpl->Render(ordered_json::array({{{"role", "user"}, {"content", "hi"}}}), options);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "26 Jul 2024 12:00");
}

TEST(ChatTemplateTest, Llama31DefaultsDateFromStrftimeNow) {
  auto tmpl = LoadTemplate("llama3_1");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  ChatRenderOptions options;
  options.now = std::chrono::system_clock::from_time_t(1721995200);
  auto out = tmpl->Render(ordered_json::array({{{"role", "user"}, {"content", "hi"}}}), options);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NE(out->find("Today Date: 26 Jul 2024\n"), std::string::npos) << *out;
}

TEST(ChatTemplateTest, ExtraKwargsOverrideSpecialTokensAndDefaults) {
  auto tmpl = ChatTemplate::FromString("{{ bos_token }}|{{ enable_thinking }}|{{ tools|length }}",
                                       {{"bos_token", "<s>"}});
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  ChatRenderOptions options;
  options.tools = ordered_json::array({{{"type", "function"}}});
  const ordered_json messages = ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_EQ(*tmpl->Render(messages, options), "<s>||1");
  options.extra_kwargs = {{"bos_token", "B"}, {"enable_thinking", false}};
  EXPECT_EQ(*tmpl->Render(messages, options), "B|False|1");
}

TEST(ChatTemplateTest, BadInputsAreInvalidArgument) {
  auto tmpl = ChatTemplate::FromString("x");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_EQ(tmpl->Render(ordered_json::object(), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tmpl->Render(ordered_json::array(), {}).status().code(),
            absl::StatusCode::kInvalidArgument);  // transformers refuses empty conversations
  const ordered_json messages = ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  ChatRenderOptions options;
  options.tools = "not a list";
  EXPECT_EQ(tmpl->Render(messages, options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig("/nonexistent/dir").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplate::FromString("x", {{"bos_token", 3}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, SpecialTokensComeFromTheConfig) {
  auto ds = ChatTemplate::FromTokenizerConfig(TokenizerDir("deepseek_v3"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->special_tokens()["bos_token"], "<｜begin▁of▁sentence｜>");  // AddedToken
  auto qwen = ChatTemplate::FromTokenizerConfig(TokenizerDir("qwen3") + "/tokenizer_config.json");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_FALSE(qwen->special_tokens().contains("bos_token"));  // null in the config
  EXPECT_EQ(qwen->special_tokens()["eos_token"], "<|im_end|>");
}

}  // namespace
}  // namespace ringserve::chat
