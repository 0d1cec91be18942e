#include "common/base/config_file.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::base {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseConfigText, ScalarsStringsArraysSectionsComments) {
  auto entries = ParseConfigText(R"(# a comment
listen = "0.0.0.0:7070"   # trailing comment
; INI comment
sync = true
frequency=99
http = ""
regex = '^a\d+#b$'
escaped = "tab\there \"q\" back\\slash"
service = ["a=^a$", 'b=^b,c$',
  "c",  # comment inside
]
word = info
[backup]
keep = 3
[default]
nested.key = 1
)",
                                  "f.toml");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 10u);
  const auto& e = *entries;
  EXPECT_EQ(e[0].key, "listen");
  EXPECT_THAT(e[0].values, ElementsAre("0.0.0.0:7070"));
  EXPECT_EQ(e[0].line, 2);
  EXPECT_THAT(e[1].values, ElementsAre("true"));
  EXPECT_THAT(e[2].values, ElementsAre("99"));
  EXPECT_THAT(e[3].values, ElementsAre(""));
  EXPECT_THAT(e[4].values, ElementsAre("^a\\d+#b$"));
  EXPECT_THAT(e[5].values, ElementsAre("tab\there \"q\" back\\slash"));
  EXPECT_TRUE(e[6].array);
  EXPECT_THAT(e[6].values, ElementsAre("a=^a$", "b=^b,c$", "c"));
  EXPECT_EQ(e[6].line, 9);
  EXPECT_THAT(e[7].values, ElementsAre("info"));
  EXPECT_THAT(e[8].section, ElementsAre("backup"));
  EXPECT_EQ(e[8].key, "keep");
  EXPECT_EQ(e[8].line, 14);
  EXPECT_THAT(e[9].section, ElementsAre("nested"));
  EXPECT_EQ(e[9].key, "key");
  EXPECT_TRUE(e[9].section.size() == 1);
}

TEST(ParseConfigText, SyntaxErrorsNameFileAndLine) {
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"a = 1\nb 2\n", "f.toml:2: expected '=' after 'b'"},
      {"a = 1\n\nb =\n", "f.toml:3: missing value"},
      {"a = \"open\n", "f.toml:1: unterminated string"},
      {"a = [1, 2\nb = 3\n", "f.toml:2: expected ',' or ']'"},
      {"a = [1, 2\n", "f.toml:1: unterminated array"},
      {"a = two words\n", "f.toml:1: unexpected 'w' after the value"},
      {"[backup\nkeep = 1\n", "f.toml:1: expected ']'"},
      {"x = 1\n\n\nx = 2\n", "f.toml:4: 'x' is set twice (first on line 1)"},
      {"r = \"\\d\"\n", "f.toml:1: unknown escape \\d"},
      {"= 3\n", "f.toml:1: unexpected '='"},
  };
  for (const Case& c : cases) {
    auto entries = ParseConfigText(c.text, "f.toml");
    ASSERT_FALSE(entries.ok()) << c.text;
    EXPECT_THAT(std::string(entries.status().message()), HasSubstr(c.want)) << c.text;
  }
}

// An app shaped like the binaries': scalars, a checked range, a choice, a flag, a repeatable
// option, a size and a duration parsed after CLI11, a subcommand.
struct TestApp {
  CLI::App app{"test"};
  std::string listen = "0.0.0.0:7070";
  uint32_t frequency = 99;
  std::string mode = "full";
  bool sync = false;
  bool checks = true;  // a flag on by default
  std::vector<int> pids;
  std::string memory = "512MiB";
  std::string retention = "7d";
  std::string http = "127.0.0.1:7071";
  uint32_t keep = 7;
  std::string to;
  CLI::App* backup = nullptr;

  TestApp() {
    app.add_option("--listen", listen, "address")->capture_default_str();
    app.add_option("--frequency", frequency, "hz")
        ->check(CLI::Range(1u, 10000u))
        ->capture_default_str();
    app.add_option("--mode", mode, "mode")
        ->check(CLI::IsMember({"full", "boundary", "off"}))
        ->capture_default_str();
    app.add_flag("--sync", sync, "fsync");
    app.add_flag("--checks", checks, "checks")->default_str("true");
    app.add_option("--pid", pids, "pids");
    app.add_option("--memory", memory, "bytes")->capture_default_str();
    app.add_option("--retention", retention, "how long")->capture_default_str();
    app.add_option("--http", http, "http")->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    backup = app.add_subcommand("backup", "copy");
    backup->add_option("--keep", keep, "backups")->capture_default_str();
    backup->add_option("--to", to, "dir");
    AddConfigFile(app);
  }

  // Parses like CLI11_PARSE; returns the exit status and what it printed.
  int Parse(std::vector<std::string> args, std::string* out = nullptr, std::string* err = nullptr) {
    args.insert(args.begin(), "test");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    std::ostringstream o, e;
    int status = 0;
    ::testing::internal::CaptureStdout();
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& error) {
      status = app.exit(error, o, e);
    }
    std::string printed = ::testing::internal::GetCapturedStdout();
    if (out) *out = printed + o.str();
    if (err) *err = e.str();
    return status;
  }
};

class ConfigFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    std::string path = dir_.File("c" + std::to_string(n_++) + ".toml");
    std::ofstream(path) << text;
    return path;
  }
  strata::testing::TempDir dir_{"config_file_test"};
  int n_ = 0;
};

TEST_F(ConfigFileTest, FileSetsEveryKindOfOption) {
  TestApp t;
  std::string path = Write(R"(listen = "10.0.0.1:9000"
frequency = 499
mode = "boundary"
sync = true
pid = [10, 20]
memory = "1GiB"
retention = "30d"
http = ""
[backup]
keep = 3
to = "/backup"
)");
  ASSERT_EQ(t.Parse({"--config", path}), 0);
  EXPECT_EQ(t.listen, "10.0.0.1:9000");
  EXPECT_EQ(t.frequency, 499u);
  EXPECT_EQ(t.mode, "boundary");
  EXPECT_TRUE(t.sync);
  EXPECT_THAT(t.pids, ElementsAre(10, 20));
  EXPECT_EQ(t.memory, "1GiB");
  EXPECT_EQ(t.retention, "30d");
  EXPECT_EQ(t.http, "");
  EXPECT_EQ(t.keep, 3u);
  EXPECT_EQ(t.to, "/backup");
}

TEST_F(ConfigFileTest, CommandLineOverridesFile) {
  TestApp t;
  std::string path = Write("listen = \"10.0.0.1:9000\"\nfrequency = 499\npid = [1]\n");
  ASSERT_EQ(t.Parse({"--frequency", "7", "--config", path, "--pid", "5", "--pid", "6"}), 0);
  EXPECT_EQ(t.frequency, 7u);
  EXPECT_EQ(t.listen, "10.0.0.1:9000");
  EXPECT_THAT(t.pids, ElementsAre(5, 6));
}

TEST_F(ConfigFileTest, BadValueOverriddenOnTheCommandLineIsNotAnError) {
  TestApp t;
  std::string path = Write("frequency = 0\n");
  EXPECT_EQ(t.Parse({"--config", path, "--frequency", "5"}), 0);
  EXPECT_EQ(t.frequency, 5u);
}

TEST_F(ConfigFileTest, BadKeysAndValuesNameFileAndLine) {
  struct Case {
    std::string text;
    std::string want;  // after "<path>:"
  } cases[] = {
      {"listen = \"x\"\nlisen = \"y\"\n", "2: unknown key 'lisen': test has no --lisen"},
      {"[backup]\nkepp = 1\n", "2: unknown key 'backup.kepp'"},
      {"\n[restore]\nkeep = 1\n", "3: unknown section [restore]"},
      {"listen = \"x\"\n\nfrequency = 0\n", "3: --frequency: Value 0 not in range 1 to 10000"},
      {"frequency = \"fast\"\n", "1: "},
      {"mode = \"partial\"\n", "1: --mode: partial not in"},
      {"sync = maybe\n", "1: 'sync' is a flag: true or false, not 'maybe'"},
      {"listen = [\"a\", \"b\"]\n", "1: 'listen' takes one value, not an array"},
      {"pid = [1, \"x\"]\n", "1: "},
      {"memory = \"12 parsecs\"\n", "1: --memory: "},
      {"retention = \"7 days\"\n", "1: --retention: "},
      {"[backup]\nkeep = -1\n", "2: "},
      {"config = \"other.toml\"\n", "1: 'config' cannot be set in a config file"},
      {"print-config = true\n", "1: 'print-config' cannot be set in a config file"},
      {"listen = \"x\" trailing\n", "1: unexpected 't' after the value"},
  };
  for (const Case& c : cases) {
    TestApp t;
    std::string path = Write(c.text);
    std::string err;
    EXPECT_NE(t.Parse({"--config", path}, nullptr, &err), 0) << c.text;
    EXPECT_THAT(err, HasSubstr(path + ":" + c.want)) << c.text;
  }
}

TEST_F(ConfigFileTest, MissingFileIsAnError) {
  TestApp t;
  std::string err;
  EXPECT_NE(t.Parse({"--config", dir_.File("absent.toml")}, nullptr, &err), 0);
  EXPECT_THAT(err, HasSubstr("absent.toml"));
}

TEST_F(ConfigFileTest, CommandLineErrorsAreNotBlamedOnTheFile) {
  TestApp t;
  std::string path = Write("listen = \"x\"\n");
  std::string err;
  EXPECT_NE(t.Parse({"--config", path, "--frequency", "0"}, nullptr, &err), 0);
  EXPECT_THAT(err, HasSubstr("--frequency: Value 0 not in range"));
  EXPECT_THAT(err, ::testing::Not(HasSubstr(path + ":")));
}

TEST_F(ConfigFileTest, PrintConfigRoundTrips) {
  TestApp t;
  std::string path = Write(
      "listen = \"a b \\\"c\\\"\"\nsync = true\npid = [3, 4]\n[backup]\nto = \"/b\"\n");
  std::string out;
  ASSERT_EQ(t.Parse({"--config", path, "--frequency", "5", "--print-config"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("listen = \"a b \\\"c\\\"\"\n"));
  EXPECT_THAT(out, HasSubstr("frequency = 5\n"));
  EXPECT_THAT(out, HasSubstr("sync = true\n"));
  EXPECT_THAT(out, HasSubstr("pid = [3, 4]\n"));
  EXPECT_THAT(out, HasSubstr("# mode = \"full\"\n"));  // a default, commented
  EXPECT_THAT(out, HasSubstr("# checks = true\n"));    // a flag on by default
  EXPECT_THAT(out, HasSubstr("[backup]\n"));
  EXPECT_THAT(out, HasSubstr("to = \"/b\"\n"));

  // What it printed is a config file giving the same settings.
  TestApp again;
  std::string printed = Write(out);
  ASSERT_EQ(again.Parse({"--config", printed}), 0);
  EXPECT_EQ(again.listen, "a b \"c\"");
  EXPECT_EQ(again.frequency, 5u);
  EXPECT_TRUE(again.sync);
  EXPECT_THAT(again.pids, ElementsAre(3, 4));
  EXPECT_EQ(again.to, "/b");
  EXPECT_EQ(again.mode, "full");
}

TEST_F(ConfigFileTest, PrintConfigReportsBadValuesLikeAStart) {
  TestApp t;
  std::string path = Write("[backup]\nkeep = \"many\"\n");
  std::string err;
  EXPECT_NE(t.Parse({"--config", path, "--print-config"}, nullptr, &err), 0);
  EXPECT_THAT(err, HasSubstr(path + ":2: "));
}

// A mistyped config path fails the check as it fails the start, in either order of the flags.
TEST_F(ConfigFileTest, PrintConfigReportsAMissingConfigFileLikeAStart) {
  const std::string missing = Write("") + ".missing";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--config", missing, "--print-config"},
        std::vector<std::string>{"--print-config", "--config", missing}}) {
    TestApp t;
    std::string out, err;
    EXPECT_NE(t.Parse(args, &out, &err), 0) << out;
    EXPECT_THAT(err, HasSubstr(missing));
    EXPECT_THAT(out, ::testing::Not(HasSubstr("configuration")));
  }
}

}  // namespace
}  // namespace strata::base
