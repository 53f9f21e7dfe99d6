// records_for_each's error paths: a JSON library exception that escapes an
// encoder (a number too large for a double: nlohmann's out_of_range.406, not a
// parse error) is a bad record with its file:line, skipped and counted under
// BadRecordPolicy::skip; long input in its message is cut; and a FIFO or a
// device is refused by what it is.
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

}  // namespace
