// The Jinja renderer against transformers' apply_chat_template rendering of
// real chat templates (tests/fixtures/chat_templates, written by
// tools/make_chat_template_fixtures.py): byte-identical text for every case,
// the same raise_exception message where the template refuses. Plus the
// loss-mask spans of hf_chat_examples on the goldens, and unit cases for
// whitespace control, scoping and error positions (expected strings from
// jinja2 with transformers' environment, noted per case).
#include "data/jinja_template.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/hf_chat_template.h"
#include "testutil.h"

namespace {

using nlohmann::ordered_json;
using rt::jinja::Object;
using rt::jinja::Template;
using rt::jinja::Value;
using rt::test::expect_error;

ordered_json load_json(const std::string& name) {
  std::ifstream f(rt::test::fixture_dir() + "/chat_templates/" + name);
  EXPECT_TRUE(f.good()) << name;
  std::stringstream s;
  s << f.rdbuf();
  return ordered_json::parse(s.str());
}

// 2025-03-07 12:00:00 in UTC, the instant the fixture pins strftime_now to.
std::time_t fixture_now() {
  setenv("TZ", "UTC", 1);
  tzset();
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 7;
  tm.tm_hour = 12;
  return timegm(&tm);
}

Object specials_of(const ordered_json& kwargs) {
  Object o;
  for (const auto& [k, v] : kwargs.items()) o.set(k, Value::from_json(v));
  return o;
}

std::string first_diff(const std::string& got, const std::string& want) {
  size_t k = 0;
  while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
  return "first difference at byte " + std::to_string(k) + ": got '" + got.substr(k, 40) + "' want '" +
         want.substr(k, 40) + "'";
}

TEST(JinjaGoldens, RenderEqualsTransformers) {
  const ordered_json templates = load_json("templates.json"), doc = load_json("cases.json");
  ASSERT_EQ(doc["now"], "2025-03-07 12:00:00");
  const std::time_t now = fixture_now();
  size_t n = 0;
  for (const auto& c : doc["cases"]) {
    const std::string name = c["name"];
    Template tpl(templates[c["template"].get<std::string>()]["template"].get<std::string>(), c["template"]);
    tpl.set_clock([now] { return now; });
    const Object vars =
        rt::hf_chat_vars(c["messages"], c["tools"], c["add_generation_prompt"], specials_of(c["kwargs"]));
    if (c.contains("error")) {
      SCOPED_TRACE(name);
      expect_error([&] { tpl.render(vars); }, {c["error"].get<std::string>()});
    } else {
      std::string got;
      try {
        got = tpl.render(vars);
      } catch (const rt::Error& e) {
        ADD_FAILURE() << name << ": " << e.what();
        continue;
      }
      const std::string want = c["expected"];
      EXPECT_EQ(got, want) << name << ": " << first_diff(got, want);
    }
    ++n;
  }
  EXPECT_GE(n, 160u);
}

// Loss masks on the goldens: every trained span is the end of an assistant
// turn; the untrained text contains every user/system content; each
// assistant message's content (as the template prints it) lies in a span.
TEST(JinjaGoldens, TrainedSpansCoverAssistantTurnsOnly) {
  const ordered_json templates = load_json("templates.json"), doc = load_json("cases.json");
  const std::time_t now = fixture_now();
  for (const auto& c : doc["cases"]) {
    if (c.contains("error") || c["add_generation_prompt"].get<bool>()) continue;
    const std::string name = c["name"];
    Template tpl(templates[c["template"].get<std::string>()]["template"].get<std::string>(), c["template"]);
    tpl.set_clock([now] { return now; });
    const auto examples = rt::hf_chat_examples(tpl, c["messages"], c["tools"], specials_of(c["kwargs"]));
    ASSERT_FALSE(examples.empty()) << name;
    if (examples.size() == 1) {
      EXPECT_EQ(examples[0].text, c["expected"].get<std::string>()) << name;
    }
    std::string trained_all, untrained_all;
    for (const auto& ex : examples) {
      size_t pos = 0;
      for (const auto& [b, e] : ex.trained) {
        ASSERT_LE(pos, b) << name;
        ASSERT_LT(b, e) << name;
        untrained_all += ex.text.substr(pos, b - pos);
        trained_all += ex.text.substr(b, e - b) + "\x01";
        pos = e;
      }
      untrained_all += ex.text.substr(pos);
    }
    for (const auto& m : c["messages"]) {
      const std::string role = m["role"];
      std::string content;
      if (m.contains("content") && m["content"].is_string()) content = m["content"];
      if (m.contains("content") && m["content"].is_array())  // Gemma-3's parts: the text ones
        for (const auto& part : m["content"])
          if (part.value("type", "") == "text") content += part["text"].get<std::string>();
      const size_t think = content.find("</think>");
      if (think != std::string::npos) content = content.substr(content.find_first_not_of('\n', think + 8));
      while (!content.empty() && (content.back() == '\n' || content.back() == ' ')) content.pop_back();
      while (!content.empty() && (content.front() == '\n' || content.front() == ' ')) content.erase(0, 1);
      if (content.empty()) continue;
      if (role == "assistant") {
        EXPECT_NE(trained_all.find(content), std::string::npos)
            << name << ": assistant content not trained: " << content;
      } else if (role == "user") {
        EXPECT_EQ(trained_all.find(content), std::string::npos) << name << ": user content trained: " << content;
      }
    }
    // every span holds the family's end-of-turn marker (Phi-3/3.5/4-mini also
    // append EOS after the last turn, which then ends that span; gpt-oss ends
    // a trained final answer with <|return|>, a tool call with <|call|>)
    const std::string fam = c["template"];
    const std::string eot = fam.rfind("llama", 0) == 0                   ? "<|eot_id|>"
                            : fam.rfind("qwen", 0) == 0 || fam == "phi4" ? "<|im_end|>"
                            : fam.rfind("mistral", 0) == 0               ? "</s>"
                            : fam.rfind("gemma", 0) == 0                 ? "<end_of_turn>"
                            : fam == "gpt-oss"                           ? "<|return|>"
                                                                         : "<|end|>";
    for (const auto& ex : examples)
      for (const auto& [b, e] : ex.trained) {
        const std::string span = ex.text.substr(b, e - b);
        EXPECT_TRUE(span.find(eot) != std::string::npos ||
                    (fam == "gpt-oss" && span.find("<|call|>") != std::string::npos))
            << name << ": span '" << span << "'";
      }
  }
}

// Qwen3 drops the reasoning of turns before the last user message, so its
// multi-turn renderings are not prefix stable: one example per assistant turn.
TEST(JinjaGoldens, Qwen3ThinkingSplitsPerTurn) {
  const ordered_json templates = load_json("templates.json");
  Template tpl(templates["qwen3"]["template"].get<std::string>(), "qwen3");
  const ordered_json msgs = ordered_json::parse(R"([
    {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
    {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}])");
  Object sp;
  sp.set("eos_token", Value::string("<|im_end|>"));
  const auto ex = rt::hf_chat_examples(tpl, msgs, nullptr, sp);
  ASSERT_EQ(ex.size(), 2u);
  ASSERT_EQ(ex[0].trained.size(), 1u);
  EXPECT_EQ(ex[0].text.substr(ex[0].trained[0].first, ex[0].trained[0].second - ex[0].trained[0].first),
            "<think>\n\n</think>\n\nA1<|im_end|>");
  EXPECT_EQ(ex[1].text.substr(ex[1].trained[0].first), "<think>\n\n</think>\n\nA2<|im_end|>\n");
  EXPECT_NE(ex[1].text.find("assistant\nA1<|im_end|>"), std::string::npos);  // earlier turn as context, untrained
}

// gpt-oss drops the reasoning of earlier turns and ends only the last final
// answer with <|return|>: one example per assistant turn, each training what
// the model writes after "<|start|>assistant" (analysis, then the final or
// commentary channel), with reasoning_effort passed through.
TEST(JinjaGoldens, GptOssTrainsEachTurnsChannels) {
  const ordered_json templates = load_json("templates.json");
  Template tpl(templates["gpt-oss"]["template"].get<std::string>(), "gpt-oss");
  tpl.set_clock([] { return fixture_now(); });
  const ordered_json msgs = ordered_json::parse(R"([
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "thinking": "Call the tool.", "tool_calls": [{"type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Bern"}}}]},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "Sunny.", "thinking": "It is sunny."}])");
  const ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const auto ex = rt::hf_chat_examples(tpl, msgs, tools, Object{}, ordered_json{{"reasoning_effort", "high"}});
  ASSERT_EQ(ex.size(), 2u);
  auto span = [](const rt::ChatExample& e) {
    EXPECT_EQ(e.trained.size(), 1u);
    return e.text.substr(e.trained[0].first, e.trained[0].second - e.trained[0].first);
  };
  EXPECT_EQ(span(ex[0]),
            "<|channel|>analysis<|message|>Call the tool.<|end|><|start|>assistant to=functions.get_weather"
            "<|channel|>commentary json<|message|>{\"city\": \"Bern\"}<|call|>");
  EXPECT_EQ(span(ex[1]),
            "<|channel|>analysis<|message|>It is sunny.<|end|><|start|>assistant<|channel|>final<|message|>"
            "Sunny.<|return|>");
  for (const auto& e : ex) {
    EXPECT_NE(e.text.find("Reasoning: high\n"), std::string::npos);
    EXPECT_NE(e.text.find("<|start|>developer<|message|># Instructions\n\nBe brief."), std::string::npos);
  }
  // the second example holds the first turn as context, its reasoning dropped
  EXPECT_EQ(ex[1].text.find("Call the tool."), std::string::npos);
}

// --chat-template-var words: JSON values as JSON, the rest as strings; the
// variables apply_chat_template sets itself are refused.
TEST(JinjaGoldens, TemplateVariablesFromWords) {
  Object vars;
  rt::hf_chat_vars_assign({"reasoning_effort=high", "enable_thinking=false", "n=3", "s=\"x y\"", "e="}, vars,
                          "--chat-template-var");
  Template t("{{ reasoning_effort }} {{ enable_thinking }} {{ n + 1 }} {{ s }} [{{ e }}]", "t");
  EXPECT_EQ(t.render(vars), "high False 4 x y []");
  expect_error([] { Object o; rt::hf_chat_vars_assign({"effort"}, o, "--chat-template-var"); },
               {"--chat-template-var", "NAME=VALUE"});
  expect_error([] { Object o; rt::hf_chat_vars_assign({"messages=[]"}, o, "--chat-template-var"); },
               {"messages", "from the data"});
  expect_error([] { Object o; rt::hf_chat_vars_assign({"1x=2"}, o, "--chat-template-var"); }, {"NAME=VALUE"});
  // passed with the special-token strings, gpt-oss sees reasoning_effort
  const ordered_json templates = load_json("templates.json");
  Template oss(templates["gpt-oss"]["template"].get<std::string>(), "gpt-oss");
  oss.set_clock([] { return fixture_now(); });
  const auto ex = rt::hf_chat_examples(
      oss, ordered_json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])"),
      nullptr, vars);
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_NE(ex[0].text.find("Reasoning: high\n"), std::string::npos);
}

// Gemma-3 folds the system message into the first user turn (untrained);
// Gemma-1/2 refuse a system turn.
TEST(JinjaGoldens, GemmaSystemTurns) {
  const ordered_json templates = load_json("templates.json");
  const ordered_json msgs = ordered_json::parse(R"([
    {"role": "system", "content": "Sys."}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}])");
  Object sp;
  sp.set("bos_token", Value::string("<bos>"));
  Template g3(templates["gemma3"]["template"].get<std::string>(), "gemma3");
  const auto ex = rt::hf_chat_examples(g3, msgs, nullptr, sp);
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].text, "<bos><start_of_turn>user\nSys.\n\nQ<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n");
  ASSERT_EQ(ex[0].trained.size(), 1u);
  EXPECT_EQ(ex[0].text.substr(ex[0].trained[0].first), "A<end_of_turn>\n");
  EXPECT_EQ(ex[0].trained[0].second, ex[0].text.size() - 1);
  for (const char* name : {"gemma", "gemma2"}) {
    Template g(templates[name]["template"].get<std::string>(), name);
    expect_error([&] { rt::hf_chat_examples(g, msgs, nullptr, sp); }, {"System role not supported"});
  }
}

std::string render(const std::string& src, const std::string& vars_json = "{}") {
  Template t(src, "t");
  Object vars;
  const ordered_json j = ordered_json::parse(vars_json);
  for (const auto& [k, v] : j.items()) vars.set(k, Value::from_json(v));
  return t.render(vars);
}

// Expected strings are what jinja2 3.1.6 prints with transformers' environment.
TEST(Jinja, WhitespaceControl) {
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");  // lstrip + trim
  EXPECT_EQ(render("a  {{- 'x' -}}  \n b"), "axb");
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(render("x {# c #}\ny"), "x y");  // trim_blocks after a comment
  EXPECT_EQ(render("line\n"), "line");       // one trailing newline dropped
  EXPECT_EQ(render("line\n\n"), "line\n");
}

TEST(Jinja, ScopesAndValues) {
  EXPECT_EQ(render("{% for i in range(3) %}{% if i == 0 %}{% set x = 'a' %}{% endif %}[{{ x }}]{% endfor %}"),
            "[a][][]");
  EXPECT_EQ(render("{% set x = 1 %}{% for i in range(2) %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}"), "12121");
  EXPECT_EQ(
      render("{% set ns = namespace(n=0) %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
      "6");
  EXPECT_EQ(render("{{ [1,'a',none,true,1.5,{'k':'v'}] }}"), "[1, 'a', None, True, 1.5, {'k': 'v'}]");
  EXPECT_EQ(render("{{ 'abc'[::-1] }}{{ [1,2,3][1:] }}{{ 'a b  c'.split() }}"), "cba[2, 3]['a', 'b', 'c']");
  EXPECT_EQ(render("{{ 1/2 }} {{ 7//2 }} {{ 2**10 }} {{ 'x'*3 }} {{ -7 % 3 }}"), "0.5 3 1024 xxx 2");
  EXPECT_EQ(render("{% macro f(a, b='x') %}<{{ a }}{{ b }}>{% endmacro %}{{ f(1) }}{{ f(1, b=2) }}"), "<1x><12>");
  EXPECT_EQ(render("{{ x|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }}"), "d  d");
  EXPECT_EQ(render("{{ 10000000000000000.0 }} {{ 0.0001 }} {{ 1e-5 }} {{ 'é'|length }}"), "1e+16 0.0001 1e-05 1");
  EXPECT_EQ(render("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif "
                   "%}{{ x }}{% endfor %}"),
            "13");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1, 'é']}|tojson }}"), "{\"b\": 1, \"a\": [1, \"é\"]}");
}

TEST(Jinja, ErrorsNamePosition) {
  expect_error([] { render("ok\n{{ x.y }}"); }, {"t:2:", "'x' is undefined"});
  expect_error([] { render("{% if x %}\n{% for %}"); }, {"t:2:"});
  expect_error([] { render("{{ raise_exception('no system role') }}"); }, {"no system role"});
  EXPECT_THROW(render("{% if true %}never closed"), rt::Error);
  // limits instead of a stack overflow or an unbounded allocation
  expect_error([] { render("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}"); },
               {"nested too deeply"});
  expect_error([] { render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); },
               {"recursed more than 100 levels"});
  EXPECT_THROW(render("{{ range(100000000)|length }}"), rt::Error);
  EXPECT_THROW(render("{% for i in range(999999) %}{% for j in range(999999) %}{% endfor %}{% endfor %}"), rt::Error);
  EXPECT_THROW(render("{{ [1][99999999999999999999] }}"), rt::Error);
  EXPECT_THROW(render("{{ 9223372036854775807 + 1 }}"), rt::Error);
  EXPECT_THROW(render("{{ 2 ** 64 }}"), rt::Error);
  EXPECT_THROW(render("{{ 'ab' * 1000000000 }}"), rt::Error);
  EXPECT_THROW(render("{{ 4 is divisibleby 0 }}"), rt::Error);
  EXPECT_EQ(render("{{ 7 // -2 }} {{ 7 % -2 }} {{ -2 ** 2 }} {{ 6 is divisibleby 3 }}"), "-4 -1 4 True");
  EXPECT_THROW(render("{{ 'abc' "), rt::Error);
}

}  // namespace
