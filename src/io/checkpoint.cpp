// Checkpoint directories (contract in checkpoint.h).
// Every byte of a checkpoint goes through one CheckedFile: an AtomicFile whose
// bytes are hashed (XXH3-64) as they are written, so checksums cost no second
// read, and where the test hooks cut the stream. The background thread never
// uses the global thread pool (the training thread does): it writes fp32 as
// it is, with no conversion.
#include "io/checkpoint.h"

#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/thread_pool.h"
#include "io/checkpoint_internal.h"
#include "io/checkpoint_unit.h"
#include "io/safetensors.h"

namespace rt {

namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;

using checkpoint_internal::hex64;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// ---- test hooks ------------------------------------------------------------

std::atomic<uint64_t> g_hook_bytes{0};  // checkpoint bytes written by this process

uint64_t env_u64(const char* name) {
  const char* s = std::getenv(name);
  if (!s || !*s) return 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  return *end ? 0 : static_cast<uint64_t>(v);
}

// An AtomicFile whose bytes are hashed and counted.
class CheckedFile {
 public:
  explicit CheckedFile(const std::string& path) : file_(path), state_(XXH3_createState()) {
    if (!state_) fail("[checkpoint] out of memory creating a hash state");
    XXH3_64bits_reset(state_);
    fail_after_ = env_u64("RAMTRAIN_INJECT_WRITE_FAIL_AFTER_BYTES");
    kill_after_ = env_u64("RAMTRAIN_INJECT_KILL_AFTER_BYTES");
  }
  ~CheckedFile() { XXH3_freeState(state_); }
  CheckedFile(const CheckedFile&) = delete;
  CheckedFile& operator=(const CheckedFile&) = delete;

  void write(const void* data, size_t n) {
    const uint64_t before = g_hook_bytes.fetch_add(n);
    const uint64_t limit = std::min(fail_after_ ? fail_after_ : UINT64_MAX, kill_after_ ? kill_after_ : UINT64_MAX);
    if (limit != UINT64_MAX && before + n > limit) {
      const size_t part = before >= limit ? 0 : static_cast<size_t>(limit - before);
      if (part) file_.write(data, part);
      if (kill_after_ && limit == kill_after_) ::raise(SIGKILL);
      fail("[file] writing ", file_.path(),
           " failed: No space left on device (injected by "
           "RAMTRAIN_INJECT_WRITE_FAIL_AFTER_BYTES=",
           fail_after_, ", a test hook)");
    }
    file_.write(data, n);
    XXH3_64bits_update(state_, data, n);
  }
  void write(const std::string& s) { write(s.data(), s.size()); }
  ManifestEntry commit() {
    file_.commit();
    return {file_.bytes_written(), XXH3_64bits_digest(state_)};
  }

 private:
  AtomicFile file_;
  XXH3_state_t* state_;
  uint64_t fail_after_ = 0, kill_after_ = 0;
};

// ---- unit files (io/checkpoint_unit.h) ----------------------------------------

std::string unit_file_name(const std::string& unit) { return "state-" + unit + ".safetensors"; }

ManifestEntry unit_write(const std::string& path, const UnitSnap& u) {
  CheckedFile f(path);
  unit_snap_write(u, [&](const void* data, size_t n) { f.write(data, n); });
  return f.commit();
}

ManifestEntry text_write(const std::string& path, const std::string& text) {
  CheckedFile f(path);
  f.write(text);
  return f.commit();
}

bool pid_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

// Removes OUT/.tmp-ckpt-<step>.<pid> and .old-ckpt-* left by dead processes (or by us).
void remove_stale_temporaries(const std::string& out_dir) {
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec)) return;
  for (auto& de : fs::directory_iterator(out_dir, ec)) {
    const std::string name = de.path().filename().string();
    if (name.rfind(".tmp-ckpt-", 0) != 0 && name.rfind(".old-ckpt-", 0) != 0) continue;
    const auto dot = name.rfind('.');
    const long pid = dot == std::string::npos ? 0 : std::strtol(name.c_str() + dot + 1, nullptr, 10);
    if (pid == static_cast<long>(::getpid()) || !pid_alive(pid)) fs::remove_all(de.path(), ec);
  }
}

void prune(const std::string& out_dir, int64_t keep_last) {
  if (keep_last <= 0) return;
  std::vector<CheckpointRef> all = checkpoint_list(out_dir);
  std::error_code ec;
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) fs::remove_all(all[i].path, ec);
}

}  // namespace

// ---- small formats -----------------------------------------------------------

uint64_t xxh3_64_of(const void* data, size_t n) { return XXH3_64bits(data, n); }

uint64_t checkpoint_bytes_written() { return g_hook_bytes.load(); }

uint64_t dataset_fingerprint(const TokenStream& tokens) {
  const uint64_t n = tokens.size(), chunk = uint64_t(1) << 20;
  XXH3_state_t* st = XXH3_createState();
  if (!st) fail("[checkpoint] out of memory creating a hash state");
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &n, sizeof n);
  std::vector<int32_t> buf;
  for (uint64_t begin : {uint64_t(0), n > chunk ? (n - chunk) / 2 : 0, n > chunk ? n - chunk : 0}) {
    const uint64_t len = std::min(chunk, n - begin);
    buf.resize(len);
    if (len) tokens.read(begin, len, buf.data());
    XXH3_64bits_update(st, buf.data(), len * sizeof(int32_t));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

std::string checkpoint_dir_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "ckpt-%08lld", static_cast<long long>(step));
  return b;
}

// ---- listing and verification ---------------------------------------------------

std::vector<CheckpointRef> checkpoint_list(const std::string& out_dir) {
  std::vector<CheckpointRef> out;
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec)) return out;
  for (auto& de : fs::directory_iterator(out_dir, ec)) {
    const std::string name = de.path().filename().string();
    if (name.size() <= 5 || name.compare(0, 5, "ckpt-") != 0 || name.size() > 5 + 18) continue;
    if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (!de.is_directory(ec)) continue;
    out.push_back({path_join(out_dir, name), std::strtoll(name.c_str() + 5, nullptr, 10)});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.step < b.step; });
  return out;
}

std::string checkpoint_verify(const std::string& dir) {
  const std::string mpath = path_join(dir, "manifest.json");
  if (!file_exists(mpath)) return "no manifest.json (an incomplete checkpoint)";
  CheckpointManifest m;
  try {
    m = manifest_parse(read_text_file(mpath), mpath);
  } catch (const Error& e) {
    return e.what();
  }
  for (const char* required : {"config.json", "trainer.json"})
    if (!m.files.count(required)) return cat("the manifest lists no ", required);
  for (auto& [name, e] : m.files) {
    const std::string p = path_join(dir, name);
    if (!file_exists(p)) return cat(name, " is missing");
    const uint64_t size = file_size(p);
    if (size != e.bytes)
      return cat(name, " has ", size, " bytes, the manifest says ", e.bytes, " (truncated or damaged)");
    uint64_t h;
    try {
      MappedFile f(p);
      h = xxh3_64_of(f.data(), f.size());
    } catch (const Error& err) {
      return err.what();
    }
    if (h != e.xxh3_64)
      return cat(name, ": checksum mismatch (xxh3_64 ", hex64(h), ", manifest ", hex64(e.xxh3_64), ")");
  }
  // The step three ways: the manifest, trainer.json and the directory's name.
  std::string clean = dir;
  while (clean.size() > 1 && clean.back() == '/') clean.pop_back();
  const std::string base = clean.substr(clean.find_last_of('/') == std::string::npos ? 0 : clean.find_last_of('/') + 1);
  try {
    const int64_t trainer_step = checkpoint_read_trainer(dir).step;
    if (trainer_step != m.step)
      return cat("trainer.json holds step ", trainer_step, " but manifest.json step ", m.step,
                 " (an inconsistent checkpoint)");
  } catch (const Error& e) {
    return e.what();
  }
  const bool named = base.size() > 5 && base.size() <= 5 + 18 && base.compare(0, 5, "ckpt-") == 0 &&
                     std::all_of(base.begin() + 5, base.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (named && std::strtoll(base.c_str() + 5, nullptr, 10) != m.step)
    return cat("its name says step ", std::strtoll(base.c_str() + 5, nullptr, 10), " but it holds step ", m.step,
               " (a copy or rename of another step's checkpoint; rename it to ", checkpoint_dir_name(m.step),
               " or remove it)");
  return "";
}

uint64_t checkpoint_bytes_estimate(const ModelSpec& spec, MomentStorage moments, MasterStorage master,
                                   UpdateRule rule) {
  uint64_t b = kCheckpointSmallFilesBytes;
  for (const UnitSnap& u : unit_snap_layouts(spec, master, moments, rule)) b += unit_file_bytes(u);
  return b;
}

std::optional<CheckpointRef> checkpoint_find_latest_valid(const std::string& out_dir,
                                                          std::vector<std::string>* warnings) {
  std::error_code ec;
  if (fs::is_directory(out_dir, ec))
    for (auto& de : fs::directory_iterator(out_dir, ec)) {
      const std::string name = de.path().filename().string();
      if (name.rfind(".tmp-ckpt-", 0) == 0 && warnings)
        warnings->push_back(
            cat("ignoring ", de.path().string(), ": an incomplete checkpoint (its save did not finish)"));
    }
  std::vector<CheckpointRef> all = checkpoint_list(out_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    std::string why = checkpoint_verify(it->path);
    if (why.empty()) return *it;
    if (warnings) warnings->push_back(cat("skipping ", it->path, ": ", why));
  }
  return std::nullopt;
}

// ---- readers -------------------------------------------------------------------

TrainerCheckpoint checkpoint_read_trainer(const std::string& dir) {
  const std::string p = path_join(dir, "trainer.json");
  return trainer_checkpoint_parse(read_text_file(p), p);
}

ModelSpec checkpoint_read_spec(const std::string& dir) { return spec_from_config_file(path_join(dir, "config.json")); }

void checkpoint_load_state(const std::string& dir, HostState& state, bool with_moments) {
  for (StateUnit& u : state.units()) unit_file_load(path_join(dir, unit_file_name(u.name)), u, with_moments);
}

UpdateRule checkpoint_read_update_rule(const std::string& dir) {
  return unit_file_update_rule(path_join(dir, unit_file_name("embed")));  // unit 0 (host_state.h)
}

MomentStorage checkpoint_read_moments(const std::string& dir, const ModelSpec& /*spec*/) {
  return unit_file_moments(path_join(dir, unit_file_name("embed")));  // unit 0 (host_state.h)
}

// ---- writer ----------------------------------------------------------------------

struct CheckpointWriter::Job {
  std::string out_dir;
  int64_t keep_last = 0;
  ModelSpec spec;
  std::vector<UnitSnap> units;
  size_t n_fetched = 0;  // save_gathered: units fetched one by one
  std::function<UnitSnap(size_t)> fetch;
  TrainerCheckpoint meta;
  SaveReport report;
  std::exception_ptr error;
  std::atomic<bool> done{false};
};

namespace {

void job_run(CheckpointWriter::Job& j);

}  // namespace

CheckpointWriter::CheckpointWriter(std::string out_dir, int64_t keep_last)
    : out_dir_(std::move(out_dir)), keep_last_(keep_last) {}

CheckpointWriter::~CheckpointWriter() {
  if (!thread_.joinable()) return;
  thread_.join();
  if (job_ && job_->error) {
    try {
      std::rethrow_exception(job_->error);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ramtrain: error: %s\n", e.what());
    }
  }
}

void CheckpointWriter::finish(std::optional<SaveReport>* out) {
  thread_.join();
  std::shared_ptr<Job> j = std::move(job_);
  if (j->error) std::rethrow_exception(j->error);
  last_path_ = j->report.path;
  if (out) *out = j->report;
}

std::optional<SaveReport> CheckpointWriter::poll() {
  std::optional<SaveReport> r;
  if (thread_.joinable() && job_->done.load()) finish(&r);
  return r;
}

std::optional<SaveReport> CheckpointWriter::wait() {
  std::optional<SaveReport> r;
  if (thread_.joinable()) finish(&r);
  return r;
}

SaveReport CheckpointWriter::save(const HostState& state, const TrainerCheckpoint& meta, bool background) {
  const auto t0 = clock_type::now();
  wait();  // the previous write (its report was already printed by poll, or is superseded)
  auto job = std::make_shared<Job>();
  job->out_dir = out_dir_;
  job->keep_last = keep_last_;
  job->spec = state.spec();
  job->meta = meta;
  job->report.step = meta.step;
  const auto& units = state.units();
  uint64_t need = 0;
  // the staging copy: the master as fp32 (a shadow master decoded), the moments and compensation as they are
  auto staged = [](const StateUnit& u) { return unit_stage_floats(u); };
  for (const StateUnit& u : units) need += static_cast<uint64_t>(staged(u)) * sizeof(float);
  if (background) {
    bool have = staging_.size() == units.size();
    for (size_t i = 0; have && i < units.size(); ++i) have = staging_[i].n == staged(units[i]);
    if (!have) {
      staging_.clear();
      const uint64_t avail = host_memory_available();
      const uint64_t want = need + need / 10 + (uint64_t(256) << 20);
      if (avail == 0 || avail < want) {
        job->report.note = cat("not enough free host RAM for a staging copy (", need >> 20, " MiB needed + margin, ",
                               avail >> 20, " MiB available): writing synchronously");
        background = false;
      } else {
        try {
          for (const StateUnit& u : units)
            staging_.emplace_back(staged(u), cat("the checkpoint staging copy of ", u.name));
        } catch (const Error& e) {
          staging_.clear();
          job->report.note = cat("cannot allocate the staging copy (", e.what(), "): writing synchronously");
          background = false;
        }
      }
    }
  }
  for (size_t i = 0; i < units.size(); ++i)
    job->units.push_back(background ? unit_snap_stage(units[i], staging_[i].p) : unit_snap_live(units[i]));
  job->report.background = background;
  job->report.stall_seconds = seconds_since(t0);
  if (!background) {
    job_run(*job);
    if (job->error) std::rethrow_exception(job->error);
    job->report.stall_seconds = seconds_since(t0);
    last_path_ = job->report.path;
    return job->report;
  }
  job_ = job;
  SaveReport early = job->report;
  thread_ = std::thread([job] { job_run(*job); });
  return early;
}

SaveReport CheckpointWriter::save_gathered(const ModelSpec& spec, size_t n_units, const TrainerCheckpoint& meta,
                                           const std::function<UnitSnap(size_t)>& fetch) {
  const auto t0 = clock_type::now();
  wait();
  auto job = std::make_shared<Job>();
  job->out_dir = out_dir_;
  job->keep_last = keep_last_;
  job->spec = spec;
  job->meta = meta;
  job->report.step = meta.step;
  job->n_fetched = n_units;
  job->fetch = fetch;
  job_run(*job);
  if (job->error) std::rethrow_exception(job->error);
  job->report.stall_seconds = seconds_since(t0);
  last_path_ = job->report.path;
  return job->report;
}

namespace {

void job_run(CheckpointWriter::Job& j) {
  const auto t0 = clock_type::now();
  const int64_t step = j.meta.step;
  const std::string name = checkpoint_dir_name(step);
  const std::string final_dir = path_join(j.out_dir, name);
  const std::string pid = std::to_string(::getpid());
  const std::string tmp = path_join(j.out_dir, cat(".tmp-ckpt-", step, ".", pid));
  std::error_code ec;
  try {
    make_dirs(j.out_dir);
    remove_stale_temporaries(j.out_dir);
    make_dirs(tmp);
    CheckpointManifest m;
    m.step = step;
    for (const UnitSnap& u : j.units) {
      const std::string f = unit_file_name(u.name);
      m.files[f] = unit_write(path_join(tmp, f), u);
    }
    for (size_t k = 0; k < j.n_fetched; ++k) {
      const UnitSnap u = j.fetch(k);
      const std::string f = unit_file_name(u.name);
      m.files[f] = unit_write(path_join(tmp, f), u);
    }
    m.files["config.json"] = text_write(path_join(tmp, "config.json"), spec_to_config_json(j.spec));
    m.files["trainer.json"] = text_write(path_join(tmp, "trainer.json"), trainer_checkpoint_to_json(j.meta));
    text_write(path_join(tmp, "manifest.json"), manifest_to_json(m));
    fsync_dir(tmp);
    const std::string old = path_join(j.out_dir, cat(".old-ckpt-", step, ".", pid));
    const bool had_old = fs::exists(final_dir, ec);
    if (had_old) {
      fs::rename(final_dir, old, ec);
      if (ec) fail("[file] cannot move the older ", final_dir, " aside: ", ec.message());
    }
    fs::rename(tmp, final_dir, ec);
    if (ec) fail("[file] cannot rename ", tmp, " to ", final_dir, ": ", ec.message());
    fsync_dir(j.out_dir);
    if (had_old) fs::remove_all(old, ec);
    j.report.path = final_dir;
    for (auto& [f, e] : m.files) j.report.bytes += e.bytes;
    j.report.bytes += file_size(path_join(final_dir, "manifest.json"));
    prune(j.out_dir, j.keep_last);
  } catch (const std::exception& e) {
    fs::remove_all(tmp, ec);
    std::vector<CheckpointRef> prev = checkpoint_list(j.out_dir);
    std::string prev_msg = prev.empty() ? std::string("There is no earlier checkpoint")
                                        : cat("The previous checkpoint ", prev.back().path, " is intact");
    j.error = std::make_exception_ptr(
        Error(cat("[checkpoint] saving step ", step, " into ", j.out_dir, " failed: ", e.what(), ". ", prev_msg,
                  "; free disk space (or fix the error) and resume with --resume auto")));
  }
  j.report.write_seconds = seconds_since(t0);
  j.done.store(true);
}

}  // namespace

SaveReport checkpoint_write(const std::string& out_dir, const HostState& state, const TrainerCheckpoint& meta,
                            int64_t keep_last) {
  CheckpointWriter w(out_dir, keep_last);
  return w.save(state, meta, false);
}

}  // namespace rt
