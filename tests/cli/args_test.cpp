// ArgParser (src/cli/args.cpp) directly: one check for every value whatever
// its source, TOML types refused rather than coerced, positional words bound
// anywhere, list options, and the help layout.
#include <gtest/gtest.h>

#include <functional>
#include <sstream>

#include "cli/args.h"
#include "core/error.h"
#include "testutil.h"

namespace {

using rt::cli::ArgParser;

using rt::test::error_of;

ArgParser make() {
  ArgParser p("demo",
              "A summary line that is long enough to be wrapped when the help is printed at its width, "
              "which is at most one hundred columns.",
              "  ramtrain demo --n 3\n");
  p.group("Numbers");
  p.option("n", "N", "a count", "1").integer(1, 10);
  p.option("x", "X", "a positive number", "0.5").above(0);
  p.option("mem", "SIZE", "a size").size();
  p.option("keep", "auto|N", "a count or auto", "auto").integer(0).or_word("auto");
  p.group("Words");
  p.option("mode", "MODE", "a choice", "a").choice({"a", "b"});
  p.flag("on", "a flag");
  p.option("input", "IN", "the input").as_positional();
  p.option("files", "F...", "files").list();
  return p;
}

TEST(Args, CommandLineValuesAreChecked) {
  for (const char* bad :
       {"--n=0", "--n=11", "--n=2.5", "--x=0", "--x=-1", "--mem=12Q", "--keep=-1", "--mode=c", "--on=yes"}) {
    ArgParser p = make();
    const std::string e = error_of([&] { p.parse({bad}); });
    const std::string name = std::string(bad).substr(0, std::string(bad).find('='));
    EXPECT_NE(e.find(name), std::string::npos) << bad << ": " << e;
  }
  ArgParser p = make();
  ASSERT_TRUE(p.parse({"--n", "10", "--x", "1e-9", "--mem", "1.5G", "--keep", "auto", "--mode", "b", "--on"}));
  EXPECT_EQ(p.integer("n"), 10);
  EXPECT_EQ(p.size_bytes("mem"), 3ull << 29);
  EXPECT_EQ(p.str("keep"), "auto");
  EXPECT_TRUE(p.on("on"));
}

TEST(Args, PositionalAnywhereAndLists) {
  ArgParser p = make();
  ASSERT_TRUE(p.parse({"--n", "2", "in.txt", "--files", "a", "b", "c", "--on"}));
  EXPECT_EQ(p.str("input"), "in.txt");
  EXPECT_EQ(p.list("files"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(p.resolved()["files"], "a,b,c");
  ArgParser q = make();
  const std::string e = error_of([&] { q.parse({"one", "two"}); });
  EXPECT_NE(e.find("unexpected argument 'two'"), std::string::npos) << e;
  ArgParser r = make();
  ASSERT_TRUE(r.parse({"--files=x,y"}));
  EXPECT_EQ(r.list("files"), (std::vector<std::string>{"x", "y"}));
  // A positional and its --option with different values: which one was meant?
  ArgParser c = make();
  const std::string both = error_of([&] { c.parse({"a.txt", "--input", "b.txt"}); });
  EXPECT_NE(both.find("a.txt (an argument) and --input b.txt both give --input: give it once"), std::string::npos)
      << both;
  ArgParser same = make();
  ASSERT_TRUE(same.parse({"a.txt", "--input", "a.txt"}));  // the same value twice is no conflict
  ArgParser last = make();
  ASSERT_TRUE(last.parse({"--n", "2", "--n", "3"}));  // a repeated option: the last one wins
  EXPECT_EQ(last.integer("n"), 3);
}

TEST(Args, TomlTakesTheSameChecksAndRefusesWrongTypes) {
  rt::test::TempDir tmp;
  const std::string path = tmp.file("c.toml");
  struct Case {
    const char* toml;
    const char* expect;  // "" accepted
  };
  for (const Case& c :
       {Case{"n = 3", ""}, Case{"n = 0", "key 'n' must be an integer >= 1 and <= 10, got '0'"},
        Case{"n = \"3\"", "key 'n' must be an integer, got a string"}, Case{"x = 2", ""},
        Case{"x = -2.0", "key 'x' must be a number > 0"}, Case{"on = \"yes\"", "key 'on' must be true or false"},
        Case{"on = true", ""}, Case{"keep = \"auto\"", ""}, Case{"keep = 4", ""},
        Case{"keep = \"many\"", "key 'keep' must be an integer >= 0 (or auto)"},
        Case{"mode = 1", "key 'mode' must be a string, got an integer"}, Case{"files = [\"a\", \"b\"]", ""},
        Case{"files = [\"a\", 2]", "an array of strings"}, Case{"mem = \"4G\"", ""},
        Case{"mem = true", "key 'mem' must be a size"}, Case{"nope = 1", "unknown key 'nope'"}}) {
    rt::test::write_bytes(path, std::string(c.toml) + "\n");
    ArgParser p = make();
    ASSERT_TRUE(p.parse({}));
    const std::string e = error_of([&] { p.merge_toml(path); });
    if (*c.expect == '\0') {
      EXPECT_EQ(e, "") << c.toml;
    } else {
      EXPECT_NE(e.find(c.expect), std::string::npos) << c.toml << ": " << e;
      EXPECT_NE(e.find(path), std::string::npos) << c.toml << ": " << e;
    }
  }
  ArgParser p = make();
  const std::string e = error_of([&] { p.merge_toml(tmp.path()); });
  EXPECT_NE(e.find("is a directory"), std::string::npos) << e;
  // The command line wins over the file, and the file over the defaults.
  rt::test::write_bytes(path, "n = 4\nx = 3.5\n");
  ArgParser q = make();
  ASSERT_TRUE(q.parse({"--n", "7"}));
  q.merge_toml(path);
  EXPECT_EQ(q.integer("n"), 7);
  EXPECT_EQ(q.number("x"), 3.5);
  EXPECT_TRUE(q.given_explicitly("x"));
  EXPECT_FALSE(q.given_explicitly("mode"));
}

TEST(Args, HelpIsGroupedAndFitsTheWidth) {
  const std::string h = make().help();
  EXPECT_NE(h.find("Usage: ramtrain demo [IN] [options]"), std::string::npos) << h;
  EXPECT_LT(h.find("\nNumbers:\n"), h.find("\nWords:\n")) << h;
  std::istringstream in(h);
  std::string line;
  while (std::getline(in, line)) EXPECT_LE(line.size(), 100u) << line;
  EXPECT_EQ(rt::cli::wrap_text("aaa bbb ccc", 8, 2), "aaa\n  bbb\n  ccc");
  uint64_t b = 0;
  EXPECT_TRUE(rt::cli::parse_size("512M", &b));
  EXPECT_EQ(b, 512ull << 20);
  EXPECT_FALSE(rt::cli::parse_size("-1G", &b));
  EXPECT_FALSE(rt::cli::parse_size("G", &b));
}

}  // namespace
