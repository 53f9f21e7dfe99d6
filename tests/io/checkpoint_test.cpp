// Checkpoint directories: exact round trip of every byte of training state,
// background writes that snapshot the state, the self-checksummed manifest,
// detection of a flipped byte in every file, the newest-valid search, pruning,
// and a failing disk (injected, and a real full tmpfs when we may mount one).
#include "io/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "core/fs.h"
#include "io/checkpoint_unit.h"
#include "optim/unit_update.h"
#include "testutil.h"

namespace {

namespace fs = std::filesystem;

using rt::test::tiny_spec;

// A state whose master, m and v all hold distinct random values.
void fill_state(rt::HostState& st, uint64_t seed) {
  for (auto& u : st.units())
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const int64_t n = u.entries[k].numel();
      for (int part = 0; part < 3; ++part) {
        std::vector<float> r = rt::test::random_vec(n, seed++, -2.f, 2.f);
        std::memcpy(u.arena.p + part * u.numel + u.offsets[k], r.data(), static_cast<size_t>(n) * 4);
      }
    }
}

rt::TrainerCheckpoint meta_at(int64_t step) {
  rt::TrainerCheckpoint c;
  c.step = step;
  c.adam_t = step - 1;
  c.skipped = 1;
  c.bad_in_a_row = 1;
  c.bad_since = step;
  c.cursor = {2, 7};
  c.run.seed = 0xfedcba9876543210ull;
  c.run.data_paths = {"/data/a.txt", "/data/b b.txt"};
  c.run.train_tokens = 1000;
  c.run.val_tokens = 100;
  c.run.train_windows = 61;
  c.run.data_fingerprint = 0x0123456789abcdefull;
  c.run.source_model_dir = "/models/x";
  c.run.tokenizer = "hf";
  c.run.run_config = {{"lr", "0.001"}, {"seq-len", "16"}};
  return c;
}

bool arenas_equal(const rt::HostState& a, const rt::HostState& b) {
  for (size_t i = 0; i < a.units().size(); ++i)
    if (std::memcmp(a.units()[i].arena.p, b.units()[i].arena.p, a.units()[i].arena.n * sizeof(float)) != 0)
      return false;
  return true;
}

std::string read_all(const std::string& p) { return rt::read_text_file(p); }

void flip_byte(const std::string& path, uint64_t pos, uint8_t mask) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(pos));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  f.seekp(static_cast<std::streamoff>(pos));
  f.write(&c, 1);
}

using rt::test::contains;

TEST(Checkpoint, ManifestRoundTripsAndEveryFlippedByteIsDetected) {
  rt::CheckpointManifest m;
  m.step = 120;
  m.files["config.json"] = {712, 0x05d19c3d445fb9c9ull};
  m.files["state-layer.0.safetensors"] = {114336, 0xffffffffffffffffull};
  m.files["trainer.json"] = {0, 0};
  const std::string text = rt::manifest_to_json(m);
  rt::CheckpointManifest back = rt::manifest_parse(text, "m");
  EXPECT_EQ(back.step, 120);
  ASSERT_EQ(back.files.size(), 3u);
  EXPECT_EQ(back.files["state-layer.0.safetensors"].xxh3_64, 0xffffffffffffffffull);
  EXPECT_EQ(back.files["config.json"].bytes, 712u);
  // Every byte, two different flips each: the self-checksum (or the parser) refuses all.
  for (size_t i = 0; i < text.size(); ++i)
    for (uint8_t mask : {uint8_t(0x01), uint8_t(0x20)}) {
      std::string t = text;
      t[i] = static_cast<char>(t[i] ^ mask);
      EXPECT_THROW(rt::manifest_parse(t, "m"), rt::Error) << "byte " << i << " mask " << int(mask);
    }
  EXPECT_THROW(rt::manifest_parse(text.substr(0, text.size() / 2), "m"), rt::Error);
  // A hand-made manifest with a path in a file name is refused even with a right checksum.
  rt::CheckpointManifest evil;
  evil.files["../x"] = {1, 2};
  EXPECT_THROW(rt::manifest_parse(rt::manifest_to_json(evil), "m"), rt::Error);
}

TEST(Checkpoint, TrainerStateRoundTripsAndBadFieldsAreNamed) {
  rt::TrainerCheckpoint c = meta_at(9);
  rt::TrainerCheckpoint b = rt::trainer_checkpoint_parse(rt::trainer_checkpoint_to_json(c), "t");
  EXPECT_EQ(b.step, 9);
  EXPECT_EQ(b.adam_t, 8);
  EXPECT_EQ(b.skipped, 1);
  EXPECT_EQ(b.bad_in_a_row, 1);
  EXPECT_EQ(b.bad_since, 9);
  EXPECT_EQ(b.cursor, c.cursor);
  EXPECT_EQ(b.run.seed, c.run.seed);
  EXPECT_EQ(b.run.data_paths, c.run.data_paths);
  EXPECT_EQ(b.run.data_fingerprint, c.run.data_fingerprint);
  EXPECT_EQ(b.run.train_windows, 61u);
  EXPECT_EQ(b.run.source_model_dir, "/models/x");
  EXPECT_EQ(b.run.tokenizer, "hf");
  EXPECT_EQ(b.run.run_config, c.run.run_config);
  std::string t = rt::trainer_checkpoint_to_json(c);
  t.replace(t.find("\"adam_t\": 8"), 11, "\"adam_t\": \"8\"");
  rt::test::expect_error([&] { rt::trainer_checkpoint_parse(t, "t.json"); }, {"adam_t", "t.json"});
  EXPECT_THROW(rt::trainer_checkpoint_parse("{}", "t"), rt::Error);
  EXPECT_THROW(rt::trainer_checkpoint_parse("[1", "t"), rt::Error);
}

TEST(Checkpoint, WriteVerifyLoadIsBitExact) {
  rt::test::TempDir tmp;
  rt::HostState a(tiny_spec(), false);
  fill_state(a, 1);
  rt::SaveReport r = rt::checkpoint_write(tmp.path(), a, meta_at(5), 3);
  EXPECT_EQ(r.path, tmp.file("ckpt-00000005"));
  EXPECT_FALSE(r.background);
  EXPECT_EQ(rt::checkpoint_verify(r.path), "");
  uint64_t on_disk = 0;
  for (auto& de : fs::directory_iterator(r.path)) on_disk += fs::file_size(de.path());
  EXPECT_EQ(r.bytes, on_disk);
  rt::HostState b(rt::checkpoint_read_spec(r.path), false);
  EXPECT_EQ(rt::spec_to_config_json(b.spec()), rt::spec_to_config_json(a.spec()));
  rt::checkpoint_load_state(r.path, b);
  EXPECT_TRUE(arenas_equal(a, b));
  rt::TrainerCheckpoint m = rt::checkpoint_read_trainer(r.path);
  EXPECT_EQ(m.step, 5);
  EXPECT_EQ(m.cursor, (rt::DataCursor{2, 7}));
  // Master only: the moments stay as they were.
  rt::HostState c(tiny_spec(), false);
  rt::checkpoint_load_state(r.path, c, false);
  EXPECT_EQ(std::memcmp(c.units()[1].master(), a.units()[1].master(), c.units()[1].numel * 4), 0);
  EXPECT_EQ(c.units()[1].m()[0], 0.0f);
  // Another shape is refused by name.
  rt::ModelSpec other = tiny_spec();
  other.intermediate = 32;
  rt::HostState d(other, false);
  rt::test::expect_error([&] { rt::checkpoint_load_state(r.path, d); }, {"mlp"});
}

TEST(Checkpoint, BackgroundWriteSnapshotsTheStateAtSave) {
  rt::test::TempDir tmp;
  rt::HostState a(tiny_spec(), false);
  fill_state(a, 7);
  rt::HostState want(tiny_spec(), false);
  fill_state(want, 7);
  rt::CheckpointWriter w(tmp.path(), 0);
  rt::SaveReport started = w.save(a, meta_at(3), true);
  // Training goes on: the live state changes while the write runs.
  fill_state(a, 99);
  std::optional<rt::SaveReport> done = w.wait();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->background, started.background);
  if (!started.background) std::printf("note: wrote synchronously: %s\n", started.note.c_str());
  EXPECT_EQ(rt::checkpoint_verify(done->path), "");
  rt::HostState b(tiny_spec(), false);
  rt::checkpoint_load_state(done->path, b);
  EXPECT_TRUE(arenas_equal(b, want));
  EXPECT_FALSE(w.poll().has_value());  // reported once
  // The synchronous path writes the same bytes.
  rt::test::TempDir tmp2;
  rt::SaveReport s = rt::checkpoint_write(tmp2.path(), want, meta_at(3), 0);
  EXPECT_EQ(read_all(done->path + "/manifest.json"), read_all(s.path + "/manifest.json"));
}

TEST(Checkpoint, AFlippedByteInAnyFileIsDetected) {
  rt::test::TempDir tmp;
  rt::HostState a(tiny_spec(), false);
  fill_state(a, 3);
  const std::string dir = rt::checkpoint_write(tmp.path(), a, meta_at(2), 0).path;
  int files = 0;
  for (auto& de : fs::directory_iterator(dir)) {
    const std::string name = de.path().filename().string(), path = de.path().string();
    const uint64_t n = fs::file_size(path);
    ++files;
    // Small text files: every byte. State files: the header and spread-out data bytes.
    std::vector<uint64_t> positions;
    if (n < 4096) {
      for (uint64_t i = 0; i < n; ++i) positions.push_back(i);
    } else {
      for (uint64_t i = 0; i < 64; ++i) positions.push_back(i);
      for (uint64_t k = 1; k < 64; ++k) positions.push_back(n * k / 64);
      positions.push_back(n - 1);
    }
    for (uint64_t pos : positions) {
      flip_byte(path, pos, 0x10);
      const std::string why = rt::checkpoint_verify(dir);
      EXPECT_NE(why, "") << name << " byte " << pos;
      EXPECT_TRUE(contains(why, name)) << name << " byte " << pos << ": " << why;
      flip_byte(path, pos, 0x10);
    }
    EXPECT_EQ(rt::checkpoint_verify(dir), "") << name;
  }
  EXPECT_EQ(files, 4 + 2 + 1);  // 4 units (embed, 2 layers, head), config, trainer, manifest
  // Truncation and a missing file are named too.
  const std::string st = dir + "/state-head.safetensors";
  fs::resize_file(st, fs::file_size(st) - 4);
  EXPECT_TRUE(contains(rt::checkpoint_verify(dir), "state-head.safetensors"));
  fs::remove(st);
  EXPECT_TRUE(contains(rt::checkpoint_verify(dir), "missing"));
  fs::remove(dir + "/manifest.json");
  EXPECT_TRUE(contains(rt::checkpoint_verify(dir), "manifest.json"));
}

TEST(Checkpoint, NewestValidSkipsCorruptAndIncompleteOnesByName) {
  rt::test::TempDir tmp;
  rt::HostState a(tiny_spec(), false);
  fill_state(a, 5);
  for (int64_t s : {2, 4, 6}) rt::checkpoint_write(tmp.path(), a, meta_at(s), 0);
  flip_byte(tmp.file("ckpt-00000006/state-layer.1.safetensors"), 100, 1);
  fs::create_directories(tmp.file(".tmp-ckpt-8.999999"));
  std::vector<std::string> w;
  auto best = rt::checkpoint_find_latest_valid(tmp.path(), &w);
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->step, 4);
  ASSERT_EQ(w.size(), 2u);
  std::string all = w[0] + "\n" + w[1];
  EXPECT_TRUE(contains(all, "ckpt-00000006")) << all;
  EXPECT_TRUE(contains(all, "state-layer.1.safetensors")) << all;
  EXPECT_TRUE(contains(all, ".tmp-ckpt-8.999999")) << all;
  fs::remove(tmp.file("ckpt-00000004/trainer.json"));
  best = rt::checkpoint_find_latest_valid(tmp.path(), nullptr);
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->step, 2);
  // A writer removes temporaries of dead processes.
  rt::checkpoint_write(tmp.path(), a, meta_at(7), 0);
  EXPECT_FALSE(fs::exists(tmp.file(".tmp-ckpt-8.999999")));
}

TEST(Checkpoint, KeepsTheNewestN) {
  rt::test::TempDir tmp;
  rt::HostState a(tiny_spec(), false);
  rt::CheckpointWriter w(tmp.path(), 2);
  for (int64_t s = 1; s <= 4; ++s) {
    w.save(a, meta_at(s), true);
    w.wait();
  }
  auto list = rt::checkpoint_list(tmp.path());
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].step, 3);
  EXPECT_EQ(list[1].step, 4);
  EXPECT_EQ(w.last_path(), tmp.file("ckpt-00000004"));
  // Saving a step again replaces it whole.
  fill_state(a, 11);
  w.save(a, meta_at(4), false);
  rt::HostState b(tiny_spec(), false);
  rt::checkpoint_load_state(tmp.file("ckpt-00000004"), b);
  EXPECT_TRUE(arenas_equal(a, b));
}

// Env var set for one scope.
struct ScopedEnv {
  ScopedEnv(const char* k, const std::string& v) : key(k) { ::setenv(k, v.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(key); }
  const char* key;
};

void expect_failed_save_left_previous(const std::string& out, const std::string& msg) {
  EXPECT_TRUE(contains(msg, "No space left on device")) << msg;
  EXPECT_TRUE(contains(msg, "The previous checkpoint " + out + "/ckpt-00000001 is intact")) << msg;
  EXPECT_EQ(rt::checkpoint_verify(out + "/ckpt-00000001"), "");
  auto list = rt::checkpoint_list(out);
  ASSERT_EQ(list.size(), 1u);
  for (auto& de : fs::directory_iterator(out))
    EXPECT_EQ(de.path().filename().string().rfind(".tmp", 0), std::string::npos) << de.path();
}

TEST(Checkpoint, AFailedWriteKeepsThePreviousCheckpoint) {
  rt::HostState a(tiny_spec(), false);
  for (bool background : {false, true}) {
    rt::test::TempDir tmp;
    rt::CheckpointWriter w(tmp.path(), 1);
    w.save(a, meta_at(1), false);
    std::string msg;
    {
      ScopedEnv env("RAMTRAIN_INJECT_WRITE_FAIL_AFTER_BYTES", std::to_string(rt::checkpoint_bytes_written() + 5000));
      try {
        w.save(a, meta_at(2), background);
        w.wait();
      } catch (const rt::Error& e) {
        msg = e.what();
      }
    }
    expect_failed_save_left_previous(tmp.path(), msg);
  }
}

// A real full disk: a tmpfs just big enough for two checkpoints (root only;
// skipped where mounting is not allowed).
TEST(Checkpoint, AFullTmpfsKeepsThePreviousCheckpoint) {
  rt::HostState a(tiny_spec(), false);
  rt::test::TempDir probe;
  const uint64_t one = rt::checkpoint_write(probe.path(), a, meta_at(1), 0).bytes;
  rt::test::TempDir tmp;
  const uint64_t size = (one * 3 / 2 + 4095) / 4096 * 4096 + 8 * 4096;  // room for one and a half, plus page slack
  if (::geteuid() != 0 ||
      ::mount("tmpfs", tmp.path().c_str(), "tmpfs", 0, ("size=" + std::to_string(size)).c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  std::string msg;
  try {
    rt::CheckpointWriter w(tmp.path(), 0);
    w.save(a, meta_at(1), false);
    w.save(a, meta_at(2), false);
  } catch (const rt::Error& e) {
    msg = e.what();
  }
  std::printf("tmpfs of %llu bytes, checkpoint of %llu bytes: %s\n", (unsigned long long)size, (unsigned long long)one,
              msg.c_str());
  expect_failed_save_left_previous(tmp.path(), msg);
  ::umount(tmp.path().c_str());
}

TEST(Checkpoint, DatasetFingerprintSeesContent) {
  std::vector<int32_t> ids(3000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 97);
  const uint64_t a = rt::dataset_fingerprint(rt::TokenStream::from_ids(ids, "a", 0));
  EXPECT_EQ(a, rt::dataset_fingerprint(rt::TokenStream::from_ids(ids, "same ids, other name", 0)));
  ids[1500] = 5;
  EXPECT_NE(a, rt::dataset_fingerprint(rt::TokenStream::from_ids(ids, "b", 0)));
  ids.pop_back();
  EXPECT_NE(a, rt::dataset_fingerprint(rt::TokenStream::from_ids(ids, "c", 0)));
}

}  // namespace

namespace {

// Rewrites DIR/trainer.json and its manifest entry (a consistent manifest, so only the step check can object).
void rewrite_trainer_json(const std::string& dir, const std::string& text) {
  rt::write_file_atomic(dir + "/trainer.json", text);
  rt::CheckpointManifest m = rt::manifest_parse(rt::read_text_file(dir + "/manifest.json"), "manifest");
  m.files["trainer.json"] = {text.size(), rt::xxh3_64_of(text.data(), text.size())};
  rt::write_file_atomic(dir + "/manifest.json", rt::manifest_to_json(m));
}

using rt::test::error_of;

}  // namespace

// A copy of another step's checkpoint under a ckpt-<step> name is not that step:
// verify names the disagreement and the newest-valid search skips that one alone.
TEST(Checkpoint, ANameThatDisagreesWithTheContentIsInvalid) {
  rt::test::TempDir tmp;
  rt::HostState a(tiny_spec(), false);
  for (int64_t s : {2, 4}) rt::checkpoint_write(tmp.path(), a, meta_at(s), 0);
  fs::copy(tmp.file("ckpt-00000002"), tmp.file("ckpt-00000009"), fs::copy_options::recursive);
  const std::string why = rt::checkpoint_verify(tmp.file("ckpt-00000009"));
  EXPECT_TRUE(contains(why, "its name says step 9 but it holds step 2")) << why;
  std::vector<std::string> w;
  auto best = rt::checkpoint_find_latest_valid(tmp.path(), &w);
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->step, 4);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(contains(w[0], "skipping " + tmp.file("ckpt-00000009") + ": its name says step 9")) << w[0];
  // Under a name that is not ckpt-<digits> (a backup given to --resume DIR), the content decides.
  fs::copy(tmp.file("ckpt-00000002"), tmp.file("backup"), fs::copy_options::recursive);
  EXPECT_EQ(rt::checkpoint_verify(tmp.file("backup")), "");
  EXPECT_EQ(rt::checkpoint_verify(tmp.file("ckpt-00000004/")), "");
  // trainer.json must hold the manifest's step.
  rewrite_trainer_json(tmp.file("backup"), rt::trainer_checkpoint_to_json(meta_at(3)));
  const std::string t = rt::checkpoint_verify(tmp.file("backup"));
  EXPECT_TRUE(contains(t, "trainer.json holds step 3 but manifest.json step 2")) << t;
}

// Every JSON reader of a checkpoint turns a number too large for a double into
// an error naming the file, never a library exception.
TEST(Checkpoint, AnOverflowingNumberInAnyJsonFileIsAnErrorNamingIt) {
  std::string tj = rt::trainer_checkpoint_to_json(meta_at(3));
  tj.replace(tj.find("\"seed\": ") + 8, 0, "1e99999, \"x\": ");
  const std::string e1 = error_of([&] { rt::trainer_checkpoint_parse(tj, "dir/trainer.json"); });
  EXPECT_TRUE(contains(e1, "[checkpoint] dir/trainer.json: invalid JSON")) << e1;
  EXPECT_TRUE(contains(e1, "number overflow")) << e1;
  std::string mj = rt::manifest_to_json(rt::CheckpointManifest{});
  mj.replace(mj.find("\"step\": ") + 8, 1, "1e99999");
  const std::string e2 = error_of([&] { rt::manifest_parse(mj, "dir/manifest.json"); });
  EXPECT_TRUE(contains(e2, "[checkpoint] dir/manifest.json: invalid JSON")) << e2;
  rt::test::TempDir tmp;
  rt::test::write_bytes(tmp.file("config.json"), "{\"hidden_size\": 1e99999}");
  const std::string e3 = error_of([&] { rt::checkpoint_read_spec(tmp.path()); });
  EXPECT_TRUE(contains(e3, tmp.file("config.json"))) << e3;
  // A 1 MB token in the text is quoted in at most ~200 bytes.
  const std::string long_tj = "{\"format\": " + std::string(1 << 20, '7') + "x}";
  const std::string e4 = error_of([&] { rt::trainer_checkpoint_parse(long_tj, "dir/trainer.json"); });
  EXPECT_TRUE(contains(e4, "bytes in all)")) << e4.substr(0, 500);
  EXPECT_LT(e4.size(), 600u) << e4.substr(0, 500);
}

// The free-space check's estimate is the checkpoint's size, for every
// optimizer and master: each unit file exactly (unit_file_bytes of the
// data-free layouts), the whole directory within the small files' allowance.
// A lean state's checkpoint holds what the state holds (a bf16 master as BF16,
// codes and scales as they are): never more than the state's own bytes plus
// the headers. The background (staged) write gives the same bytes as the
// synchronous one, and a state loaded from the files writes them again byte
// for byte (so a resume starts from exactly the saved state).
TEST(Checkpoint, TheSizeEstimateIsTheWrittenSize) {
  rt::test::TempDir tmp;
  const rt::ModelSpec spec = tiny_spec();
  int i = 0;
  for (rt::UpdateRule rule : {rt::UpdateRule::adamw, rt::UpdateRule::muon})
    for (rt::MomentStorage mo : {rt::MomentStorage::fp32, rt::MomentStorage::q8, rt::MomentStorage::q4})
      for (rt::MasterStorage ma : {rt::MasterStorage::fp32, rt::MasterStorage::split, rt::MasterStorage::bf16_sr,
                                   rt::MasterStorage::bf16_kahan}) {
        const std::string what = std::string(rt::optimizer_name(rule, mo)) + " " + rt::master_storage_name(ma);
        SCOPED_TRACE(what);
        rt::HostState st(spec, false, mo, ma, rule);
        st.init_random(7);
        rt::OptimStep o;
        o.t = 1;
        o.lr = 1e-2;
        for (rt::StateUnit& u : st.units()) {  // nonzero moments (and a Kahan compensation)
          const std::vector<float> g = rt::test::random_vec(u.numel, 100 + static_cast<uint64_t>(u.index), -1.f, 1.f);
          rt::update_unit(u, g.data(), o, 1.0f, u.shadow_master() ? u.shadow(u.cur_shadow) : nullptr);
        }
        const std::string a = tmp.file("a" + std::to_string(i)), b = tmp.file("b" + std::to_string(i));
        const std::string c = tmp.file("c" + std::to_string(i++));
        const rt::SaveReport r = rt::checkpoint_write(a, st, meta_at(1), 0);
        const std::string dir = a + "/" + rt::checkpoint_dir_name(1);
        const std::vector<rt::UnitSnap> layouts = rt::unit_snap_layouts(spec, ma, mo, rule);
        ASSERT_EQ(layouts.size(), st.units().size());
        uint64_t unit_bytes = 0;
        for (const rt::UnitSnap& l : layouts) {
          const std::string f = dir + "/state-" + l.name + ".safetensors";
          EXPECT_EQ(rt::file_size(f), rt::unit_file_bytes(l)) << l.name;
          unit_bytes += rt::file_size(f);
          const std::string master = "\"master/" + l.entries[0].name + "\":{\"dtype\":\"";
          EXPECT_TRUE(contains(rt::read_text_file(f), master + (rt::master_is_bf16(ma) ? "BF16" : "F32") + "\""))
              << l.name;
        }
        const uint64_t est = rt::checkpoint_bytes_estimate(spec, mo, ma, rule);
        EXPECT_GE(est, r.bytes);
        EXPECT_LE(est, r.bytes + rt::kCheckpointSmallFilesBytes);
        EXPECT_EQ(est, unit_bytes + rt::kCheckpointSmallFilesBytes);
        // the data as held (headers: a few KiB a unit at this size)
        EXPECT_LE(unit_bytes, st.bytes_total() + st.units().size() * (uint64_t(8) << 10));
        // staged == live, and load -> write repeats every byte
        rt::CheckpointWriter w(b, 0);
        w.save(st, meta_at(1), true);
        w.wait();
        rt::HostState back(spec, false, mo, ma, rule);
        rt::checkpoint_load_state(dir, back);
        rt::checkpoint_write(c, back, meta_at(1), 0);
        for (const rt::UnitSnap& l : layouts) {
          const std::string f = "/" + rt::checkpoint_dir_name(1) + "/state-" + l.name + ".safetensors";
          const std::string want = rt::read_text_file(a + f);
          EXPECT_TRUE(rt::read_text_file(b + f) == want) << "staged " << l.name;
          EXPECT_TRUE(rt::read_text_file(c + f) == want) << "reloaded " << l.name;
        }
      }
  // the case: a Qwen3-30B-A3B checkpoint in adamw4bit + bf16-sr is ~3.03 B/param, not fp32's 12
  const rt::ModelSpec moe = rt::spec_preset("qwen3-30b-a3b");
  const double p = static_cast<double>(moe.params_total());
  const double lean =
      static_cast<double>(rt::checkpoint_bytes_estimate(moe, rt::MomentStorage::q4, rt::MasterStorage::bf16_sr)) / p;
  const double full = static_cast<double>(rt::checkpoint_bytes_estimate(moe)) / p;
  std::printf("Qwen3-30B-A3B checkpoint: adamw4bit + bf16-sr %.3f B/param, adamw fp32 %.3f B/param\n", lean, full);
  EXPECT_NEAR(lean, 2 + rt::moment_bytes_per_param(rt::MomentStorage::q4), 0.01);
  EXPECT_NEAR(full, 12, 0.01);
}

// Checkpoints before the lean ones held a bf16 master as F32 (its bf16
// values): such a file loads into a bf16 master exactly. Made here by writing
// the bf16 state's master from an fp32-master state of the same values.
TEST(Checkpoint, AnF32MasterFileLoadsIntoABf16MasterExactly) {
  rt::test::TempDir tmp;
  const rt::ModelSpec spec = tiny_spec();
  for (rt::MasterStorage ms : {rt::MasterStorage::bf16_sr, rt::MasterStorage::bf16_kahan}) {
    SCOPED_TRACE(rt::master_storage_name(ms));
    rt::HostState b(spec, false, rt::MomentStorage::fp32, ms), f(spec, false);
    b.init_random(3);
    for (size_t i = 0; i < b.units().size(); ++i)
      b.units()[i].read_master(0, b.units()[i].numel, f.units()[i].master());
    const std::string out = tmp.file(rt::master_storage_name(ms));
    rt::checkpoint_write(out, f, meta_at(1), 0);
    const std::string dir = out + "/" + rt::checkpoint_dir_name(1);
    EXPECT_TRUE(
        contains(rt::read_text_file(dir + "/state-head.safetensors"), "\"master/lm_head.weight\":{\"dtype\":\"F32\""));
    rt::HostState back(spec, false, rt::MomentStorage::fp32, ms);
    rt::checkpoint_load_state(dir, back, false);
    for (size_t i = 0; i < b.units().size(); ++i) {
      const rt::StateUnit &u = b.units()[i], &v = back.units()[i];
      EXPECT_EQ(std::memcmp(u.shadow(0), v.shadow(0), static_cast<size_t>(u.numel) * 2), 0) << u.name;
    }
  }
}

// A data-parallel GPU rank's checkpoint (CheckpointWriter::save_gathered):
// units fetched one at a time as fp32 master, m and v (unit_snap_fp32, the
// fetch's buffer reused for every unit). The files are those save() writes
// for the same fp32 state, byte for byte, and a failing fetch leaves no
// checkpoint behind.
TEST(Checkpoint, GatheredUnitsWriteTheSameFilesAsTheState) {
  rt::test::TempDir tmp;
  rt::HostState a(tiny_spec(), false);
  fill_state(a, 3);
  const std::string want = rt::checkpoint_write(tmp.file("whole"), a, meta_at(4), 0).path;
  rt::CheckpointWriter w(tmp.file("gathered"), 0);
  std::vector<float> buf;
  size_t calls = 0;
  const rt::SaveReport r = w.save_gathered(a.spec(), a.units().size(), meta_at(4), [&](size_t u) {
    EXPECT_EQ(u, calls++) << "units are fetched in order";
    const rt::StateUnit& x = a.units()[u];
    buf.assign(static_cast<size_t>(3 * x.numel), -1.0f);
    std::memcpy(buf.data(), x.arena.p, buf.size() * 4);  // [master | m | v], as gather_unit stages them
    return rt::unit_snap_fp32(x, buf.data(), buf.data() + x.numel, buf.data() + 2 * x.numel);
  });
  EXPECT_EQ(calls, a.units().size());
  EXPECT_EQ(rt::checkpoint_verify(r.path), "");
  size_t files = 0;
  for (auto& de : fs::directory_iterator(want)) {
    ++files;
    EXPECT_EQ(read_all(de.path().string()), read_all(r.path + "/" + de.path().filename().string()))
        << de.path().filename();
  }
  EXPECT_EQ(files, a.units().size() + 3);
  // a fetch that fails (a rank lost) writes nothing and names the step
  rt::CheckpointWriter bad(tmp.file("bad"), 0);
  rt::test::expect_error(
      [&] {
        bad.save_gathered(a.spec(), a.units().size(), meta_at(6), [&](size_t u) -> rt::UnitSnap {
          if (u == 1) rt::fail("[dp] rank 1 is gone");
          const rt::StateUnit& x = a.units()[u];
          return rt::unit_snap_fp32(x, x.arena.p, x.arena.p + x.numel, x.arena.p + 2 * x.numel);
        });
      },
      {"saving step 6", "rank 1 is gone"});
  EXPECT_TRUE(rt::checkpoint_list(tmp.file("bad")).empty());
}
