// Every flag of strata-server, strata-agent, strata and strata-loadgen through a config file.
// The option lists come from the binaries (`--print-config` prints each option with its type
// and default), so a flag added later is covered without changing this test: each option gets
// a value other than its default, the file is read back by the binary, and the binary must
// report every key as set, with that value.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/config_file.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::base {
namespace {

using ::testing::HasSubstr;

struct Result {
  int status = -1;
  std::string out;
};

Result RunCommand(const std::string& command) {
  Result r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// One option as --print-config lists it.
struct Listed {
  std::string section;  // "" or "backup", "top", ...
  std::string key;
  std::string type;     // "UINT:INT in [1 - 10000]", "flag", "TEXT, repeatable", ...
  bool set = false;
  bool has_default = false;
  std::string value_text;  // TOML text after "key = "
};

std::string FullKey(const Listed& o) { return o.section.empty() ? o.key : o.section + "." + o.key; }

std::map<std::string, Listed> ListOptions(const std::string& printed) {
  static const std::regex kType(R"(^#   type: (.*)$)");
  static const std::regex kKey(R"(^(# )?([A-Za-z0-9_-]+) =( (.*))?$)");
  static const std::regex kSection(R"(^\[(.*)\]$)");
  std::map<std::string, Listed> out;
  std::string section, type;
  std::vector<std::string> lines = absl::StrSplit(printed, '\n');
  for (const std::string& line : lines) {
    std::smatch m;
    if (std::regex_match(line, m, kSection)) {
      section = m[1];
    } else if (std::regex_match(line, m, kKey)) {
      Listed o;
      o.section = section;
      o.key = m[2];
      o.type = type;
      o.set = !m[1].matched;
      o.has_default = m[4].matched && !m[4].str().empty();
      o.value_text = m[4];
      out[FullKey(o)] = o;
    } else if (std::regex_match(line, m, kType)) {
      type = m[1];
    }
  }
  return out;
}

// The values a TOML value text stands for, read by the helper's own parser.
std::vector<std::string> Values(const std::string& value_text) {
  auto entries = ParseConfigText("k = " + value_text + "\n", "value");
  if (!entries.ok() || entries->empty()) return {"<unparsable: " + value_text + ">"};
  return (*entries)[0].values;
}

std::string Quote(const std::string& s) { return "\"" + s + "\""; }

bool Numeric(const std::string& type) {
  return type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0 ||
         type.rfind("FLOAT", 0) == 0 || type.rfind("NUMBER", 0) == 0;
}

// Adds one to the last number in `s` ("0.0.0.0:7070" -> "0.0.0.0:7071", "7d" -> "8d").
std::string BumpLastNumber(const std::string& s) {
  static const std::regex kLast(R"(([0-9]+)([^0-9]*)$)");
  std::smatch m;
  if (!std::regex_search(s, m, kLast)) return "";
  uint64_t n = 0;
  if (!absl::SimpleAtoi(m[1].str(), &n)) return "";
  return s.substr(0, m.position(1)) + std::to_string(n + 1) + m[2].str();
}

// A value for the option other than its default, valid for its type, range and choices.
std::string NewValue(const Listed& o, const std::string& file_value,
                     const std::string& dir_value) {
  static const std::regex kChoices(R"(\{([^}]*)\})");
  static const std::regex kRange(R"(in \[(-?[0-9.e+]+) - (-?[0-9.e+]+)\])");
  if (o.type == "flag") return "true";
  // CLI11's ExistingFile / ExistingDirectory / ExistingPath checks: something that exists.
  if (o.type.find(":FILE") != std::string::npos) return Quote(file_value);
  if (o.type.find(":DIR") != std::string::npos || o.type.find(":PATH") != std::string::npos) {
    return Quote(dir_value);
  }
  const bool repeatable = o.type.find("repeatable") != std::string::npos;
  // A value checked as A=B (an agent's service rules and labels) gets that form.
  if (repeatable && o.type.find("=") != std::string::npos) {
    return "[\"cfg_one=one\", \"cfg_two=two\"]";
  }
  if (repeatable) return Numeric(o.type) ? "[7, 8]" : "[\"cfg-one\", \"cfg-two\"]";
  std::string def = o.has_default ? Values(o.value_text).front() : "";
  std::smatch m;
  if (std::regex_search(o.type, m, kChoices)) {
    std::vector<std::string> choices = absl::StrSplit(m[1].str(), ',');
    for (const std::string& choice : choices) {
      if (choice != def) return Quote(choice);
    }
    return Quote(choices.front());  // one choice: still set from the file, as the output shows
  }
  if (Numeric(o.type)) {
    double d = 0, lo = -1e18, hi = 1e18;
    if (!def.empty()) (void)absl::SimpleAtod(def, &d);
    if (std::regex_search(o.type, m, kRange)) {
      (void)absl::SimpleAtod(m[1].str(), &lo);
      (void)absl::SimpleAtod(m[2].str(), &hi);
    }
    if (def.empty()) d = lo > 0 ? lo : 0;
    double v = d + 1 <= hi ? d + 1 : d - 1;
    if (v < lo) v = lo;
    if (o.type.find("POSITIVE") != std::string::npos && v <= 0) v = 1;
    if (o.type.find("FLOAT") == 0) return absl::StrCat(v);
    return absl::StrCat(static_cast<int64_t>(v));
  }
  if (std::string bumped = BumpLastNumber(def); !bumped.empty()) return Quote(bumped);
  return Quote(def.empty() ? "cfg-value" : "cfg-" + def);
}

class ConfigFileBinaries : public ::testing::TestWithParam<const char*> {
 protected:
  strata::testing::TempDir dir_{"config_file_binaries_test"};
};

TEST_P(ConfigFileBinaries, EveryFlagRoundTripsThroughAConfigFile) {
  const std::string bin = GetParam();
  Result listed = RunCommand(bin + " --print-config");
  ASSERT_EQ(listed.status, 0) << listed.out;
  std::map<std::string, Listed> options = ListOptions(listed.out);
  ASSERT_GT(options.size(), 3u) << listed.out;

  const std::string existing_file = dir_.File("existing");
  std::ofstream(existing_file) << "x\n";
  // The file: top-level keys first, then each section's.
  std::map<std::string, std::vector<std::string>> by_section;
  std::map<std::string, std::string> wrote;
  for (const auto& [full, o] : options) {
    std::string value = NewValue(o, existing_file, dir_.path());
    wrote[full] = value;
    by_section[o.section].push_back(o.key + " = " + value);
  }
  std::string text;
  for (const auto& [section, lines] : by_section) {
    if (!section.empty()) absl::StrAppend(&text, "[", section, "]\n");
    absl::StrAppend(&text, absl::StrJoin(lines, "\n"), "\n");
  }
  const std::string path = dir_.File("all.toml");
  std::ofstream(path) << text;

  Result back = RunCommand(bin + " --config " + path + " --print-config");
  ASSERT_EQ(back.status, 0) << back.out << "\nfile:\n" << text;
  std::map<std::string, Listed> got = ListOptions(back.out);
  for (const auto& [full, value] : wrote) {
    SCOPED_TRACE(full + " = " + value);
    ASSERT_TRUE(got.count(full)) << back.out;
    EXPECT_TRUE(got[full].set) << "not set from the file";
    EXPECT_EQ(Values(got[full].value_text), Values(value));
  }
  EXPECT_EQ(got.size(), options.size());
}

TEST_P(ConfigFileBinaries, FlagOverridesTheFileAndBadFilesNameTheLine) {
  const std::string bin = GetParam();
  Result listed = RunCommand(bin + " --print-config");
  ASSERT_EQ(listed.status, 0) << listed.out;
  std::map<std::string, Listed> options = ListOptions(listed.out);
  // A top-level option taking a text value.
  const Listed* text_option = nullptr;
  for (const auto& [full, o] : options) {
    if (o.section.empty() && o.type.rfind("TEXT", 0) == 0 &&
        o.type.find("repeatable") == std::string::npos && o.type.find('{') == std::string::npos &&
        o.type.find(':') == std::string::npos) {
      text_option = &o;
      break;
    }
  }
  ASSERT_NE(text_option, nullptr) << listed.out;
  const std::string key = text_option->key;
  const std::string path = dir_.File("one.toml");
  std::ofstream(path) << "# comment\n" << key << " = \"from-file\"\n";
  Result r = RunCommand(bin + " --config " + path + " --" + key + " from-flag --print-config");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr(key + " = \"from-flag\"\n"));
  r = RunCommand(bin + " --" + key + " from-flag --config " + path + " --print-config");
  EXPECT_THAT(r.out, HasSubstr(key + " = \"from-flag\"\n"));
  r = RunCommand(bin + " --config " + path + " --print-config");
  EXPECT_THAT(r.out, HasSubstr(key + " = \"from-file\"\n"));

  const std::string bad_key = dir_.File("bad_key.toml");
  std::ofstream(bad_key) << key << " = \"x\"\n\nno-such-flag = 1\n";
  r = RunCommand(bin + " --config " + bad_key + " --print-config");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr(bad_key + ":3: unknown key 'no-such-flag'"));

  const std::string bad_syntax = dir_.File("bad_syntax.toml");
  std::ofstream(bad_syntax) << key << " = \"x\"\n" << key << "2 \"y\"\n";
  r = RunCommand(bin + " --config " + bad_syntax + " --print-config");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr(bad_syntax + ":2: expected '='"));

  // A numeric option given a word.
  for (const auto& [full, o] : options) {
    if (!o.section.empty() || !Numeric(o.type) || o.type.find("repeatable") != std::string::npos)
      continue;
    const std::string bad_value = dir_.File("bad_value.toml");
    std::ofstream(bad_value) << "\n" << o.key << " = \"lots\"\n";
    r = RunCommand(bin + " --config " + bad_value + " --print-config");
    EXPECT_NE(r.status, 0);
    EXPECT_THAT(r.out, HasSubstr(bad_value + ":2: ")) << o.key;
    break;
  }
}

INSTANTIATE_TEST_SUITE_P(Binaries, ConfigFileBinaries,
                         ::testing::Values(STRATA_SERVER_BIN, STRATA_AGENT_BIN, STRATA_CLI_BIN,
                                           STRATA_LOADGEN_BIN),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           name = name.substr(name.rfind('/') + 1);
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace strata::base
