#include "cli/resume.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/fs.h"
#include "core/quote.h"

namespace rt::cli {

namespace {

// Options that define the run: a different value is refused.
const std::set<std::string> kDefining = {"seq-len", "micro-batch", "grad-accum", "seed", "val-fraction"};
// Options whose saved value is not compared (handled apart or irrelevant after a resume).
const std::set<std::string> kNotCompared = {"resume", "config",  "data",    "preset",
                                            "model",  "init",    "out",     "threads", "overwrite"};
// Options that change nothing numerically when overridden.
const std::set<std::string> kHarmless = {
    "eval-every",     "eval-batches",     "log-every",      "save-every", "keep-checkpoints", "metrics",
    "export-dtype",   "sample-prompt",    "sample-tokens",  "trace",      "max-bad-steps",    "slots",
    "max-gpu-memory", "keep-activations", "keep-attention", "state-dir",  "max-host-memory"};

bool same_value(const std::string& a, const std::string& b) {
  if (a == b) return true;
  auto num = [](const std::string& s, double* v) {
    char* end = nullptr;
    *v = std::strtod(s.c_str(), &end);
    return !s.empty() && *end == '\0';
  };
  double x, y;
  if (num(a, &x) && num(b, &y)) return x == y;
  auto falsy = [](const std::string& s) { return s == "false" || s == "0" || s == "(unset)"; };
  return falsy(a) && falsy(b);
}

std::string abs_path(const std::string& p) {
  std::error_code ec;
  auto a = std::filesystem::absolute(p, ec);
  return ec ? p : a.lexically_normal().string();
}

void supersede_newer(const std::string& out_dir, int64_t step, const std::string& keep) {
  for (const CheckpointRef& c : checkpoint_list(out_dir)) {
    std::error_code eq;
    if (c.step <= step || (!keep.empty() && std::filesystem::equivalent(c.path, keep, eq))) continue;
    const std::string to = cat(c.path, ".superseded-", ::getpid());
    std::error_code ec;
    std::filesystem::rename(c.path, to, ec);
    if (ec) fail("[train] cannot move ", c.path, " aside: ", ec.message());
    std::printf("warning: %s is newer than the step this run continues from (%lld); moved aside to %s\n",
                c.path.c_str(), (long long)step, to.c_str());
  }
}

}  // namespace

std::string spec_differences(const ModelSpec& saved, const ModelSpec& now) {
  ModelSpec a = saved, b = now;
  a.dtype = b.dtype = "float32";  // storage dtype, not the model
  nlohmann::json ja = nlohmann::json::parse(spec_to_config_json(a)), jb = nlohmann::json::parse(spec_to_config_json(b));
  std::string out;
  std::set<std::string> keys;
  for (auto it = ja.begin(); it != ja.end(); ++it) keys.insert(it.key());
  for (auto it = jb.begin(); it != jb.end(); ++it) keys.insert(it.key());
  for (const std::string& k : keys) {
    const std::string va = ja.contains(k) ? ja[k].dump() : "(absent)", vb = jb.contains(k) ? jb[k].dump() : "(absent)";
    if (va != vb) out += cat(out.empty() ? "" : ", ", k, ": checkpoint ", va, ", this run ", vb);
  }
  return out;
}

std::optional<ResumeSource> resume_prepare(ArgParser& p, std::vector<std::string>& data_paths) {
  const std::string out = p.str("out");
  if (!p.has("resume")) return std::nullopt;  // a fresh run: fresh_out_check looks at --out
  const std::string r = p.str("resume");
  ResumeSource src;
  if (r == "auto") {
    std::vector<std::string> warnings;
    std::optional<CheckpointRef> ref = checkpoint_find_latest_valid(out, &warnings);
    for (auto& w : warnings) std::printf("warning: %s\n", w.c_str());
    if (!ref) {
      std::printf("--resume auto: no valid checkpoint in %s; starting from step 0\n", out.c_str());
      return std::nullopt;
    }
    src.dir = ref->path;
  } else {
    src.dir = r;
    if (!is_directory(r)) fail("[train] --resume ", r, ": no such checkpoint directory (or use --resume auto)");
    const std::string why = checkpoint_verify(r);
    if (!why.empty()) fail("[train] --resume ", r, " is not a valid checkpoint: ", why);
  }
  src.meta = checkpoint_read_trainer(src.dir);
  src.spec = checkpoint_read_spec(src.dir);
  const auto& saved = src.meta.run.run_config;

  std::vector<std::string> refused, warned;
  std::set<std::string> keys;
  for (auto& [k, v] : saved) keys.insert(k);
  for (auto& [k, v] : p.resolved()) keys.insert(k);
  for (const std::string& k : keys) {
    if (kNotCompared.count(k) || !p.given_explicitly(k)) continue;
    const std::string old = saved.count(k) ? saved.at(k) : "(unset)", now = p.str(k);
    if (same_value(old, now)) continue;
    const std::string what = cat("--", k, " ", quote_input(now), " (the checkpoint ran with ", quote_input(old), ")");
    auto muon = [](const std::string& o) { return o.rfind("muon", 0) == 0; };
    if (k == "optimizer" && muon(old) != muon(now))  // Muon momentum and Adam moments do not convert
      refused.push_back(what + ": Muon momentum and Adam moments do not convert; resume with --optimizer " +
                        (muon(old) ? "muon, muon8bit or muon4bit" : "adamw, adamw8bit or adamw4bit"));
    else if (kDefining.count(k))
      refused.push_back(what);
    else if (!kHarmless.count(k))
      warned.push_back(what);
  }
  const bool model_given = p.given_explicitly("preset") || p.given_explicitly("model");
  if (model_given) {
    ModelSpec now = p.given_explicitly("preset") ? spec_preset(p.str("preset"))
                                                 : spec_from_config_file(path_join(p.str("model"), "config.json"));
    std::string d = spec_differences(src.spec, now);
    if (!d.empty()) refused.push_back(cat("the model: ", d));
  }
  if (!refused.empty()) {
    std::string list;
    for (auto& s : refused) list += "\n  - " + s;
    fail("[train] cannot resume from ", src.dir, ": this run differs from it in what defines a run:", list,
         "\nDrop these options (the checkpoint's values are used), or start a new run with another --out.");
  }
  for (auto& w : warned)
    std::printf("warning: resuming with %s: allowed, but the run no longer matches an uninterrupted one\n", w.c_str());

  std::map<std::string, std::string> base;
  for (auto& [k, v] : saved) {
    if (k == "resume" || k == "config" || k == "data" || k == "overwrite") continue;
    if (model_given && (k == "preset" || k == "model" || k == "init")) continue;
    base[k] = v;
  }
  p.merge_base(base);
  if (data_paths.empty()) {
    data_paths = src.meta.run.data_paths;
  } else {
    std::vector<std::string> now;
    for (auto& d : data_paths) now.push_back(abs_path(d));
    if (now != src.meta.run.data_paths)
      std::printf("warning: --data names other paths than the checkpoint's run; resuming if the tokens are the same\n");
  }
  return src;
}

void fresh_out_check(const ArgParser& p, bool resumed) {
  if (resumed || p.has("overwrite")) return;
  const std::string out = p.str("out"), final_dir = path_join(out, "final");
  const bool has_final = file_exists(final_dir) || is_directory(final_dir);
  if (p.has("resume")) {  // auto found no valid checkpoint
    if (has_final)
      fail("[train] --resume auto: no valid checkpoint in ", out, ", but ", final_dir,
           " holds the final model of a finished run. Pick another --out, or pass --overwrite to train again "
           "from step 0 and replace it.");
    return;
  }
  std::vector<CheckpointRef> existing = checkpoint_list(out);
  std::string held;
  auto add = [&](const std::string& what) { held += (held.empty() ? "" : ", ") + what; };
  if (!existing.empty()) add(cat("checkpoints (newest ", existing.back().path, ")"));
  if (has_final) add(cat("a final model (", final_dir, ")"));
  const std::string metrics = path_join(out, "metrics.jsonl");
  if (!p.has("metrics") && file_exists(metrics) && file_size(metrics) > 0) add(cat("metrics (", metrics, ")"));
  if (!held.empty())
    fail("[train] ", out, " already holds a run: ", held, ". ",
         existing.empty() ? "Pick another --out" : "Continue it with --resume auto, or pick another --out",
         ", or pass --overwrite to replace it with this run.");
}

RunLock out_dir_lock(const std::string& out_dir, uint64_t checkpoint_bytes) {
  if (out_dir.empty()) return RunLock();
  RunLock lock = RunLock::acquire(out_dir, "[train]", "--out");
  const std::string warning = check_out_writable(out_dir, checkpoint_bytes, "[train]", "--out");
  if (!warning.empty()) std::printf("warning: %s\n", warning.c_str());
  return lock;
}

void resume_commit(const ArgParser& p, const std::optional<ResumeSource>& r) {
  if (!p.has("resume")) {  // a fresh run: --out held no earlier run, or --overwrite replaces it
    if (!p.has("overwrite")) return;
    for (const CheckpointRef& c : checkpoint_list(p.str("out"))) {
      std::error_code ec;
      std::filesystem::remove_all(c.path, ec);
      if (ec) fail("[train] --overwrite: cannot remove the earlier run's checkpoint ", c.path, ": ", ec.message());
      std::printf("--overwrite: removed the earlier run's checkpoint %s\n", c.path.c_str());
    }
    return;
  }
  if (r)
    std::printf("resuming from %s: step %lld, data cursor %s\n", r->dir.c_str(), (long long)r->meta.step,
                r->meta.cursor.to_string().c_str());
  supersede_newer(p.str("out"), r ? r->meta.step : 0, r ? r->dir : std::string());
}

void resume_check_data(const ResumeSource& r, const BatchSource& data) {
  const RunIdentity& s = r.meta.run;
  std::string d;
  auto cmp = [&](const char* what, uint64_t a, uint64_t b) {
    if (a != b) d += cat("\n  - ", what, ": checkpoint ", a, ", this run ", b);
  };
  cmp("train tokens", s.train_tokens, data.train_token_count());
  cmp("validation tokens", s.val_tokens, data.val_token_count());
  cmp("train windows", s.train_windows, data.train_window_count());
  if (d.empty() && s.data_fingerprint != dataset_fingerprint(data))
    d += "\n  - the token content (same size, other tokens: the fingerprint differs)";
  if (!d.empty())
    fail(
        "[train] cannot resume from ", r.dir, ": the data differs from the checkpoint's run:", d,
        "\nResume with the same --data (the checkpoint's run used: ",
        [&] {
          std::string l;
          for (auto& p : s.data_paths) l += (l.empty() ? "" : " ") + p;
          return l;
        }(),
        ").");
}

}  // namespace rt::cli
