#include "data/hf_chat_template.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace rt {

namespace {

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) fail("[data] cannot read ", path);
  return s.str();
}

nlohmann::ordered_json parse_json_file(const std::string& path, const std::string& text) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("[data] ", path, " is not valid JSON (", e.what(), ")");
  }
}

// "chat_template": a string, or [{"name": ..., "template": ...}, ...] (the "default" one).
std::optional<std::string> template_field(const nlohmann::ordered_json& j, const std::string& path) {
  if (!j.is_object() || !j.contains("chat_template") || j["chat_template"].is_null()) return std::nullopt;
  const auto& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const auto& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        return e["template"].get<std::string>();
    fail("[data] ", path, ": chat_template is a list without a \"default\" entry; ramtrain uses the default template");
  }
  fail("[data] ", path, ": chat_template must be a string or a list of {name, template}");
}

}  // namespace

std::optional<HfChatTemplate> hf_chat_template_find(const std::string& model_dir) {
  HfChatTemplate t;
  const std::string cfg_path = model_dir + "/tokenizer_config.json";
  nlohmann::ordered_json cfg;
  if (auto text = read_text(cfg_path)) cfg = parse_json_file(cfg_path, *text);
  if (cfg.is_object()) {
    for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
      if (!cfg.contains(k)) continue;
      const auto& v = cfg[k];
      if (v.is_string())
        t.specials.set(k, jinja::Value::string(v.get<std::string>()));
      else if (v.is_object() && v.contains("content") && v["content"].is_string())
        t.specials.set(k, jinja::Value::string(v["content"].get<std::string>()));
      else if (v.is_null())
        t.specials.set(k, jinja::Value::none());
    }
  }
  if (auto text = read_text(model_dir + "/chat_template.jinja")) {
    t.source = *text;
    t.origin = model_dir + "/chat_template.jinja";
    return t;
  }
  const std::string json_path = model_dir + "/chat_template.json";
  if (auto text = read_text(json_path)) {
    auto src = template_field(parse_json_file(json_path, *text), json_path);
    if (!src) fail("[data] ", json_path, " has no \"chat_template\" string");
    t.source = *src;
    t.origin = json_path;
    return t;
  }
  if (auto src = template_field(cfg, cfg_path)) {
    t.source = *src;
    t.origin = cfg_path + " chat_template";
    return t;
  }
  return std::nullopt;
}

void hf_chat_vars_assign(const std::vector<std::string>& words, jinja::Object& vars, const std::string& option) {
  for (const std::string& w : words) {
    const size_t eq = w.find('=');
    const std::string name = w.substr(0, eq);
    bool ident = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
    for (char c : name) ident = ident && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (eq == std::string::npos || !ident)
      fail("[data] ", option, " '", w, "': give NAME=VALUE with NAME a template variable name (e.g. ", option,
           " reasoning_effort=high enable_thinking=false)");
    if (name == "messages" || name == "tools" || name == "documents" || name == "add_generation_prompt")
      fail("[data] ", option, " '", w, "': ", name, " is set from the data itself; pick another variable");
    const std::string value = w.substr(eq + 1);
    const auto j = nlohmann::ordered_json::parse(value, nullptr, /*allow_exceptions=*/false);
    vars.set(name, j.is_discarded() ? jinja::Value::string(value) : jinja::Value::from_json(j));
  }
}

jinja::Object hf_chat_vars(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                           bool add_generation_prompt, const jinja::Object& specials,
                           const nlohmann::ordered_json& extra) {
  jinja::Object vars = specials;
  jinja::Array msgs;
  for (const auto& m : messages) {
    jinja::Value v = jinja::Value::from_json(m);
    if (v.is_object()) {  // transformers' _alias_reasoning_fields
      const jinja::Value* r = nullptr;
      for (const char* k : {"reasoning_content", "thinking", "reasoning"}) {
        const jinja::Value* x = v.obj->find(k);
        if (x && !x->is_none()) {
          r = x;
          break;
        }
      }
      if (r) {
        const jinja::Value reasoning = *r;
        jinja::Object o;
        o.set("thinking", reasoning);
        for (const auto& [k, x] : v.obj->items) o.set(k, x);
        o.set("reasoning_content", reasoning);
        v = jinja::Value::object(std::move(o));
      }
    }
    msgs.push_back(std::move(v));
  }
  vars.set("messages", jinja::Value::array(std::move(msgs)));
  vars.set("tools", tools.is_null() ? jinja::Value::none() : jinja::Value::from_json(tools));
  vars.set("documents", jinja::Value::none());
  vars.set("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  if (extra.is_object())
    for (const auto& [k, x] : extra.items()) vars.set(k, jinja::Value::from_json(x));
  return vars;
}

std::vector<ChatExample> hf_chat_examples(const jinja::Template& tpl, const nlohmann::ordered_json& messages,
                                          const nlohmann::ordered_json& tools, const jinja::Object& specials,
                                          const nlohmann::ordered_json& extra) {
  auto render_with = [&](size_t n, bool gen, const nlohmann::ordered_json* last) {
    nlohmann::ordered_json part = nlohmann::ordered_json::array();
    for (size_t k = 0; k < n; ++k) part.push_back(last && k + 1 == n ? *last : messages[k]);
    return tpl.render(hf_chat_vars(part, tools, gen, specials, extra));
  };
  auto render = [&](size_t n, bool gen) { return render_with(n, gen, nullptr); };
  struct Turn {
    std::string q;
    size_t begin, end;
  };
  std::vector<Turn> turns;
  for (size_t k = 0; k < messages.size(); ++k) {
    const auto& m = messages[k];
    if (!m.is_object() || m.value("role", "") != "assistant") continue;
    const std::string q = render(k + 1, false);
    std::string p = render(k, true);
    if (q.compare(0, p.size(), p) != 0) {
      // The prompt is rendered differently once the turn follows (Mistral
      // puts the system message into the last user message): the turn starts
      // where the rendering first differs from one with an empty assistant turn.
      const nlohmann::ordered_json empty = {{"role", "assistant"}, {"content", ""}};
      const std::string q0 = render_with(k + 1, false, &empty);
      size_t b = 0;
      while (b < q.size() && b < q0.size() && q[b] == q0[b]) ++b;
      // The two may agree past the turn's opening (gpt-oss: both continue
      // "<|channel|>", then analysis vs final): back up to just after the
      // generation prompt's text (P_k minus the rendering without it), when
      // the template has one and it occurs before b.
      std::string gen;
      try {
        const std::string p0 = render(k, false);
        if (p.compare(0, p0.size(), p0) == 0) gen = p.substr(p0.size());
      } catch (const Error&) {
      }
      if (!gen.empty() && b >= gen.size()) {
        const size_t at = q.rfind(gen, b - gen.size());
        if (at != std::string::npos) b = at + gen.size();
      }
      p = q.substr(0, b);
    }
    size_t end = q.size();
    while (end > p.size() && (q[end - 1] == '\n' || q[end - 1] == ' ' || q[end - 1] == '\t' || q[end - 1] == '\r'))
      --end;
    turns.push_back({q, p.size(), end});
  }
  const std::string full = render(messages.size(), false);
  bool stable = true;
  for (const Turn& t : turns) stable = stable && full.compare(0, t.q.size(), t.q) == 0;
  std::vector<ChatExample> out;
  if (stable) {
    ChatExample ex{full, {}};
    for (const Turn& t : turns)
      if (t.end > t.begin) ex.trained.emplace_back(t.begin, t.end);
    out.push_back(std::move(ex));
    return out;
  }
  for (Turn& t : turns) {
    ChatExample ex{std::move(t.q), {}};
    if (t.end > t.begin) ex.trained.emplace_back(t.begin, t.end);
    out.push_back(std::move(ex));
  }
  return out;
}

}  // namespace rt
