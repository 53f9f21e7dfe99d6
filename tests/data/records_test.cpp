// records_for_each's error paths: a JSON library exception that escapes an
// encoder (a number too large for a double: nlohmann's out_of_range.406, not a
// parse error) is a bad record with its file:line, skipped and counted under
// BadRecordPolicy::skip; long input in its message is cut; and a FIFO or a
// device is refused by what it is. Record streams (the Python module's data)
// read as the same lines in a .jsonl file do, in chunks, with their errors
// named by the record's number.
#include "data/records.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "testutil.h"

namespace {

using rt::test::contains;

// An encoder that parses each line with nlohmann (throwing what nlohmann throws) and keeps the text's length.
void json_encoder(const rt::RecordPiece& p, rt::EncodedPiece& e) {
  const nlohmann::json j = nlohmann::json::parse(p.bytes);
  e.ids.push_back(static_cast<int32_t>(j.at("text").get<std::string>().size()));
}

struct Outcome {
  rt::RecordStats stats;
  std::vector<int32_t> ids;
  std::string error;
};
Outcome run(const std::string& file, rt::BadRecordPolicy policy) {
  Outcome r;
  rt::RecordOptions o;
  o.bad_records = policy;
  o.max_warnings = 0;
  try {
    r.stats = rt::records_for_each({file}, o, json_encoder,
                                   [&](const char*, std::vector<int32_t>& ids, std::vector<uint8_t>&) {
                                     r.ids.insert(r.ids.end(), ids.begin(), ids.end());
                                   });
  } catch (const rt::Error& e) {
    r.error = e.what();
  }
  return r;
}

TEST(RecordErrors, AnOverflowingNumberIsABadRecordWithItsLine) {
  rt::test::TempDir tmp;
  const std::string f = tmp.file("d.jsonl");
  rt::test::write_bytes(f, "{\"text\": \"ab\"}\n\n{\"text\": \"x\", \"w\": -1e99999}\n{\"text\": \"abcd\"}\n");
  Outcome a = run(f, rt::BadRecordPolicy::abort);
  EXPECT_TRUE(contains(a.error, "[data] " + f + ":3: a number is out of range: number overflow parsing '-1e99999'"))
      << a.error;
  EXPECT_TRUE(contains(a.error, "--bad-lines skip")) << a.error;
  Outcome s = run(f, rt::BadRecordPolicy::skip);
  EXPECT_EQ(s.error, "");
  EXPECT_EQ(s.ids, (std::vector<int32_t>{2, 4}));
  EXPECT_EQ(s.stats.bad.at("number out of range"), 1u);
  EXPECT_EQ(s.stats.records, 2u);
}

TEST(RecordErrors, LongInputInAnEncodersJsonErrorIsCut) {
  rt::test::TempDir tmp;
  const std::string f = tmp.file("d.jsonl");
  // A 1 MB number: nlohmann quotes the whole token in its message.
  rt::test::write_bytes(f, "{\"text\": \"a\", \"w\": 1" + std::string(1 << 20, '0') + "e99999}\n");
  Outcome a = run(f, rt::BadRecordPolicy::abort);
  EXPECT_TRUE(contains(a.error, f + ":1: a number is out of range")) << a.error.substr(0, 500);
  EXPECT_TRUE(contains(a.error, "bytes in all)")) << a.error.substr(0, 500);
  EXPECT_LT(a.error.size(), 600u) << a.error.substr(0, 500);
}

TEST(RecordErrors, AFifoOrADeviceIsRefusedByWhatItIs) {
  rt::test::TempDir tmp;
  ASSERT_EQ(::mkfifo(tmp.file("p.jsonl").c_str(), 0644), 0);
  Outcome a = run(tmp.file("p.jsonl"), rt::BadRecordPolicy::abort);
  EXPECT_TRUE(contains(a.error, tmp.file("p.jsonl") + ": is a FIFO (named pipe), not a regular file")) << a.error;
  Outcome b = run("/dev/zero", rt::BadRecordPolicy::abort);
  EXPECT_TRUE(contains(b.error, "/dev/zero: is a character device")) << b.error;
}

// A stream handing over the lines of text in chunks of k lines: the records, their ids and the
// bad record's line are those of the same text in a .jsonl file, for any k.
TEST(RecordStreams, ReadAsTheSameJsonlFileInAnyChunking) {
  rt::test::TempDir tmp;
  const std::string f = tmp.file("d.jsonl");
  std::string text;
  for (int i = 0; i < 40; ++i) text += "{\"text\": \"" + std::string(size_t(i % 7), 'x') + "\"}\n";
  rt::test::write_bytes(f, text);
  const Outcome want = run(f, rt::BadRecordPolicy::abort);
  ASSERT_EQ(want.error, "");
  ASSERT_EQ(want.stats.records, 40u);
  for (size_t k : {1, 3, 40, 100}) {
    size_t pos = 0;
    const std::string name = rt::record_stream_add("test", [&](std::string& chunk) {
      if (pos >= text.size()) return false;
      size_t end = pos;
      for (size_t n = 0; n < k && end < text.size(); ++n) end = text.find('\n', end) + 1;
      chunk = text.substr(pos, end - pos);
      pos = end;
      return true;
    });
    EXPECT_EQ(name, "<python:test>");
    EXPECT_TRUE(rt::is_record_stream(name));
    EXPECT_TRUE(rt::path_is_jsonl(name, rt::DataFormat::auto_detect));
    const Outcome got = run(name, rt::BadRecordPolicy::abort);
    rt::record_stream_remove(name);
    EXPECT_FALSE(rt::is_record_stream(name));
    EXPECT_EQ(got.error, "") << "chunks of " << k;
    EXPECT_EQ(got.ids, want.ids) << "chunks of " << k;
    EXPECT_EQ(got.stats.records, want.stats.records);
    EXPECT_EQ(got.stats.bytes, want.stats.bytes);
  }
  // a bad record is named by its number, as the file's line
  const std::string bad = "{\"text\": \"a\"}\n{\"text\": \"b\", \"w\": 1e99999}\n";
  bool given = false;
  const std::string name = rt::record_stream_add("bad", [&](std::string& chunk) {
    if (given) return false;
    chunk = bad;
    return given = true;
  });
  const Outcome a = run(name, rt::BadRecordPolicy::abort);
  rt::record_stream_remove(name);
  EXPECT_TRUE(contains(a.error, "[data] <python:bad>:2: a number is out of range")) << a.error;
  // a source that fails is an error of the data, not an internal one
  const std::string broken =
      rt::record_stream_add("broken", [](std::string&) -> bool { rt::fail("[data] the source went away"); });
  const Outcome b = run(broken, rt::BadRecordPolicy::abort);
  rt::record_stream_remove(broken);
  EXPECT_EQ(b.error, "[data] the source went away");
}

}  // namespace
