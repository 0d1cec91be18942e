#include "common/base/config_file.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/byte_size.h"
#include "common/base/duration.h"

namespace strata::base {
namespace {

bool IsKeyChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
}

// A cursor over the file's text that knows its line number, for the messages.
class Scanner {
 public:
  Scanner(std::string_view text, std::string_view file) : text_(text), file_(file) {}

  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  int line() const { return line_; }
  void Advance() {
    if (text_[pos_] == '\n') ++line_;
    ++pos_;
  }
  // Spaces and tabs; with `newlines`, line ends and comments too (inside arrays).
  void SkipSpace(bool newlines) {
    while (!AtEnd()) {
      char c = Peek();
      if (c == ' ' || c == '\t' || c == '\r') {
        Advance();
      } else if (newlines && c == '\n') {
        Advance();
      } else if (newlines && (c == '#' || c == ';')) {
        while (!AtEnd() && Peek() != '\n') Advance();
      } else {
        break;
      }
    }
  }
  // After a complete statement: only a comment may follow on the line.
  absl::Status EndOfLine() {
    SkipSpace(false);
    if (Peek() == '#' || Peek() == ';') {
      while (!AtEnd() && Peek() != '\n') Advance();
    }
    if (AtEnd()) return absl::OkStatus();
    if (Peek() != '\n') return Error(absl::StrCat("unexpected '", std::string(1, Peek()),
                                                  "' after the value (quote values with spaces)"));
    Advance();
    return absl::OkStatus();
  }
  absl::Status Error(std::string_view what) const { return ErrorAt(line_, what); }
  absl::Status ErrorAt(int line, std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ":", line, ": ", std::string(what)));
  }

  // "..." with TOML's escapes, or '...' taken literally; the opening quote is next.
  absl::StatusOr<std::string> QuotedString() {
    const char quote = Peek();
    const int start_line = line_;
    Advance();
    std::string out;
    while (true) {
      if (AtEnd() || Peek() == '\n') return ErrorAt(start_line, "unterminated string");
      char c = Peek();
      Advance();
      if (c == quote) return out;
      if (c != '\\' || quote == '\'') {
        out.push_back(c);
        continue;
      }
      if (AtEnd()) return ErrorAt(start_line, "unterminated string");
      char e = Peek();
      Advance();
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case '/': out.push_back('/'); break;
        default:
          // Regular expressions are common values: "\d" must not silently become "d".
          return ErrorAt(line_, absl::StrCat("unknown escape \\", std::string(1, e),
                                             " in a \"string\" (write \\\\, or use 'literal' "
                                             "quotes)"));
      }
    }
  }

  // A value without quotes: a number, a boolean or an INI-style word, up to a separator.
  absl::StatusOr<std::string> BareScalar(bool in_array) {
    std::string out;
    while (!AtEnd()) {
      char c = Peek();
      if (c == '\n' || c == '#' || c == ';' || c == ' ' || c == '\t' || c == '\r') break;
      if (in_array && (c == ',' || c == ']')) break;
      if (c == '"' || c == '\'' || c == '[' || c == ']' || c == '=') {
        return Error(absl::StrCat("unexpected '", std::string(1, c), "' in a value"));
      }
      out.push_back(c);
      Advance();
    }
    if (out.empty()) return Error("missing value after '='");
    return out;
  }

  absl::StatusOr<std::string> Scalar(bool in_array) {
    if (Peek() == '"' || Peek() == '\'') return QuotedString();
    return BareScalar(in_array);
  }

  // A key, bare or quoted; dotted keys name a subcommand's option.
  absl::StatusOr<std::vector<std::string>> DottedKey() {
    std::vector<std::string> parts;
    while (true) {
      SkipSpace(false);
      std::string part;
      if (Peek() == '"' || Peek() == '\'') {
        auto s = QuotedString();
        if (!s.ok()) return s.status();
        part = *s;
      } else {
        while (!AtEnd() && IsKeyChar(Peek()) && Peek() != '.') {
          part.push_back(Peek());
          Advance();
        }
      }
      if (part.empty()) {
        return Error(AtEnd() || Peek() == '\n' ? "expected key = value"
                                               : absl::StrCat("unexpected '", std::string(1, Peek()),
                                                              "' in a key"));
      }
      parts.push_back(part);
      SkipSpace(false);
      if (Peek() != '.') return parts;
      Advance();
    }
  }

 private:
  std::string_view text_;
  std::string file_;
  size_t pos_ = 0;
  int line_ = 1;
};

std::string JoinPath(const std::vector<std::string>& section, const std::string& key) {
  std::vector<std::string> parts = section;
  parts.push_back(key);
  return absl::StrJoin(parts, ".");
}

// The app's own options and those of its unnamed option groups.
std::vector<CLI::Option*> OptionsOf(CLI::App* app) {
  std::vector<CLI::Option*> out = app->get_options({});
  for (CLI::App* group : app->get_subcommands({})) {
    if (!group->get_name().empty()) continue;
    for (CLI::Option* opt : OptionsOf(group)) {
      if (std::find(out.begin(), out.end(), opt) == out.end()) out.push_back(opt);
    }
  }
  return out;
}
std::vector<const CLI::Option*> OptionsOf(const CLI::App* app) {
  std::vector<const CLI::Option*> out;
  for (CLI::Option* opt : OptionsOf(const_cast<CLI::App*>(app))) out.push_back(opt);
  return out;
}

// The key an option has in a file: its long name, else its short one, else its positional name.
std::string KeyOf(const CLI::Option* opt) {
  if (!opt->get_lnames().empty()) return opt->get_lnames().front();
  if (!opt->get_snames().empty()) return opt->get_snames().front();
  return opt->get_name();
}

bool Printable(const CLI::App& app, const CLI::Option* opt) {
  return opt->get_configurable() && opt != app.get_help_ptr() && opt != app.get_help_all_ptr() &&
         opt != app.get_config_ptr() && !KeyOf(opt).empty();
}

// Finds the option a key names, as CLI11 will when it applies the file.
CLI::Option* FindOption(CLI::App* app, const std::string& key) {
  CLI::Option* op = app->get_option_no_throw("--" + key);
  if (op == nullptr && key.size() == 1) op = app->get_option_no_throw("-" + key);
  if (op == nullptr) op = app->get_option_no_throw(key);
  return op;
}

CLI::App* FindSubcommand(CLI::App* app, const std::string& name) {
  for (CLI::App* sub : app->get_subcommands({})) {
    if (!sub->get_name().empty() && sub->check_name(name)) return sub;
  }
  return nullptr;
}

// What the messages need after CLI11 took over: which option each applied key fed, and where.
struct SharedState {
  std::string file;
  struct Applied {
    std::vector<std::string> names;  // how CLI11's messages spell the option
    int line;
  };
  std::vector<Applied> applied;
};

bool MentionsName(const std::string& message, const std::string& name) {
  for (size_t at = message.find(name); at != std::string::npos;
       at = message.find(name, at + 1)) {
    const size_t end = at + name.size();
    const bool left_ok = at == 0 || !(IsKeyChar(message[at - 1]) && message[at - 1] != '.');
    const bool right_ok = end >= message.size() || !IsKeyChar(message[end]) || message[end] == '.';
    if (left_ok && right_ok) return true;
  }
  return false;
}

// CLI11's reader, replaced: the file is parsed and checked here, against the app, and handed
// to CLI11 as items it applies without further guessing.
class StrataConfigFormatter : public CLI::Config {
 public:
  StrataConfigFormatter(CLI::App* app, std::shared_ptr<SharedState> state)
      : app_(app), state_(std::move(state)) {}

  std::string to_config(const CLI::App* app, bool, bool, std::string) const override {
    return FormatEffectiveConfig(*app);
  }

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    std::string file = "config";
    if (const CLI::Option* config = app_->get_config_ptr(); config && !config->results().empty()) {
      file = config->results().back();
    }
    state_->file = file;
    state_->applied.clear();
    std::stringstream buffer;
    buffer << input.rdbuf();
    auto entries = ParseConfigText(buffer.str(), file);
    if (!entries.ok()) throw CLI::ConfigError(std::string(entries.status().message()));
    std::vector<CLI::ConfigItem> items;
    for (const ConfigEntry& entry : *entries) {
      CLI::App* app = app_;
      for (size_t i = 0; i < entry.section.size(); ++i) {
        CLI::App* sub = FindSubcommand(app, entry.section[i]);
        if (sub == nullptr) {
          std::vector<std::string> path(entry.section.begin(), entry.section.begin() + i + 1);
          throw CLI::ConfigError(absl::StrCat(file, ":", entry.line, ": unknown section [",
                                              absl::StrJoin(path, "."), "]: ", app->get_name(),
                                              " has no subcommand ", entry.section[i]));
        }
        app = sub;
      }
      CLI::Option* op = FindOption(app, entry.key);
      const std::string full = JoinPath(entry.section, entry.key);
      if (op == nullptr) {
        throw CLI::ConfigError(absl::StrCat(file, ":", entry.line, ": unknown key '", full,
                                            "': ", app->get_name(), " has no --", entry.key));
      }
      if (!op->get_configurable() || op == app->get_config_ptr()) {
        throw CLI::ConfigError(absl::StrCat(file, ":", entry.line, ": '", full,
                                            "' cannot be set in a config file"));
      }
      if (entry.array && op->get_items_expected_max() <= 1) {
        throw CLI::ConfigError(absl::StrCat(file, ":", entry.line, ": '", full,
                                            "' takes one value, not an array"));
      }
      if (op->get_expected_min() == 0 && entry.values.size() == 1) {
        // A flag: CLI11 would take any word as "true"; only booleans and numbers are meant.
        const std::string& v = entry.values[0];
        if (v != "true" && v != "false" && v != "on" && v != "off" && v != "yes" && v != "no" &&
            v.find_first_not_of("0123456789") != std::string::npos) {
          throw CLI::ConfigError(absl::StrCat(file, ":", entry.line, ": '", full,
                                              "' is a flag: true or false, not '", v, "'"));
        }
      }
      if (op->count() == 0) {  // a flag on the command line wins and the file's value is unused
        SharedState::Applied applied{{}, entry.line};
        for (const std::string& l : op->get_lnames()) applied.names.push_back("--" + l);
        for (const std::string& s : op->get_snames()) applied.names.push_back("-" + s);
        applied.names.push_back(op->get_name());
        state_->applied.push_back(std::move(applied));
      }
      CLI::ConfigItem item;
      item.parents = entry.section;
      item.name = entry.key;
      item.inputs = entry.values;
      items.push_back(std::move(item));
    }
    return items;
  }

 private:
  CLI::App* app_;
  std::shared_ptr<SharedState> state_;
};

// Runs the conversions and checks of every option set so far, here and in subcommands, so that
// --print-config reports a bad value as the real start would.
void RunCallbacks(CLI::App* app) {
  for (CLI::Option* opt : OptionsOf(app)) {
    if (opt->count() > 0 && !opt->get_callback_run()) opt->run_callback();
  }
  for (CLI::App* sub : app->get_subcommands({})) {
    if (!sub->get_name().empty()) RunCallbacks(sub);
  }
}

bool LooksNumeric(const std::string& s) {
  static const std::regex kNumber(R"([+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?)");
  return std::regex_match(s, kNumber);
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default: out.push_back(c);
    }
  }
  return out + "\"";
}

std::string FormatValue(const CLI::Option* opt, const std::vector<std::string>& values) {
  auto scalar = [](const std::string& v) { return LooksNumeric(v) ? v : Quote(v); };
  if (opt->get_expected_min() == 0) {  // a flag
    bool on = false;
    try {
      on = opt->as<bool>();
    } catch (const CLI::Error&) {
    }
    return on ? "true" : "false";
  }
  if (opt->get_items_expected_max() > 1) {
    std::vector<std::string> parts;
    for (const std::string& v : values) parts.push_back(scalar(v));
    return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
  }
  return values.empty() ? "\"\"" : scalar(values.back());
}

void FormatApp(const CLI::App& app, const std::vector<std::string>& section, std::string* out) {
  bool header_written = section.empty();
  for (const CLI::Option* opt : OptionsOf(&app)) {
    if (!Printable(app, opt)) continue;
    if (!header_written) {
      absl::StrAppend(out, "\n[", absl::StrJoin(section, "."), "]\n");
      header_written = true;
    }
    std::string type = opt->get_expected_min() == 0 ? "flag" : opt->get_type_name();
    if (opt->get_expected_min() != 0 && opt->get_items_expected_max() > 1) {
      absl::StrAppend(&type, ", repeatable");
    }
    std::string description = opt->get_description();
    for (char& c : description) {
      if (c == '\n') c = ' ';
    }
    absl::StrAppend(out, "# ", description, "\n#   type: ", type, "\n");
    if (opt->count() > 0) {
      absl::StrAppend(out, KeyOf(opt), " = ", FormatValue(opt, opt->results()), "\n");
    } else if (opt->get_expected_min() == 0) {  // a flag: off unless its default says on
      absl::StrAppend(out, "# ", KeyOf(opt), " = ",
                      opt->get_default_str() == "true" ? "true" : "false", "\n");
    } else if (!opt->get_default_str().empty()) {
      absl::StrAppend(out, "# ", KeyOf(opt), " = ",
                      FormatValue(opt, {opt->get_default_str()}), "\n");
    } else {
      absl::StrAppend(out, "# ", KeyOf(opt), " =\n");
    }
  }
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name().empty()) continue;
    std::vector<std::string> sub_section = section;
    sub_section.push_back(sub->get_name());
    FormatApp(*sub, sub_section, out);
  }
}

// Byte sizes and durations are plain strings to CLI11 and parsed by the program after it; the
// file's errors should still name their line, so such options get a check CLI11 runs.
void AddUnitChecks(CLI::App* app) {
  // Upper-case units only: "10m" is ten minutes, never ten mebibytes.
  static const std::regex kSize(R"([0-9]+(\.[0-9]+)?\s*([KMGT](i?B)?|B))");
  static const std::regex kDuration(R"(([0-9]+(ms|s|m|h|d|w))+)");
  for (CLI::Option* opt : OptionsOf(app)) {
    const std::string def = opt->get_default_str();
    if (def.empty() || opt->get_expected_min() == 0) continue;
    if (std::regex_match(def, kSize)) {
      opt->check(CLI::Validator(
          [](std::string& s) -> std::string {
            auto bytes = ParseByteSize(s);
            return bytes.ok() ? "" : std::string(bytes.status().message());
          },
          "SIZE"));
    } else if (std::regex_match(def, kDuration)) {
      opt->check(CLI::Validator(
          [](std::string& s) -> std::string {
            auto ms = ParseRetention(s);
            return ms.ok() ? "" : std::string(ms.status().message());
          },
          "DURATION"));
    }
  }
  for (CLI::App* sub : app->get_subcommands({})) AddUnitChecks(sub);
}

}  // namespace

absl::StatusOr<std::vector<ConfigEntry>> ParseConfigText(std::string_view text,
                                                         std::string_view file_name) {
  Scanner in(text, file_name);
  std::vector<ConfigEntry> entries;
  std::vector<std::string> section;
  absl::flat_hash_map<std::string, int> seen;  // full key -> line
  while (true) {
    in.SkipSpace(false);
    if (in.AtEnd()) break;
    const char c = in.Peek();
    if (c == '\n') {
      in.Advance();
      continue;
    }
    if (c == '#' || c == ';') {
      while (!in.AtEnd() && in.Peek() != '\n') in.Advance();
      continue;
    }
    const int line = in.line();
    if (c == '[') {
      in.Advance();
      const bool table_array = in.Peek() == '[';
      if (table_array) in.Advance();
      auto name = in.DottedKey();
      if (!name.ok()) return name.status();
      if (in.Peek() != ']') return in.Error("expected ']' to close the section header");
      in.Advance();
      if (table_array) {
        if (in.Peek() != ']') return in.Error("expected ']]' to close the section header");
        in.Advance();
      }
      if (auto st = in.EndOfLine(); !st.ok()) return st;
      section = *name;
      if (section.size() == 1 && absl::AsciiStrToLower(section[0]) == "default") section.clear();
      continue;
    }
    auto key = in.DottedKey();
    if (!key.ok()) return key.status();
    if (in.Peek() != '=' && in.Peek() != ':') {
      return in.Error(absl::StrCat("expected '=' after '", absl::StrJoin(*key, "."), "'"));
    }
    in.Advance();
    in.SkipSpace(false);
    ConfigEntry entry;
    entry.section = section;
    entry.section.insert(entry.section.end(), key->begin(), key->end() - 1);
    entry.key = key->back();
    entry.line = line;
    if (in.Peek() == '[') {
      entry.array = true;
      in.Advance();
      while (true) {
        in.SkipSpace(true);
        if (in.AtEnd()) return in.ErrorAt(line, "unterminated array: expected ']'");
        if (in.Peek() == ']') {
          in.Advance();
          break;
        }
        auto v = in.Scalar(/*in_array=*/true);
        if (!v.ok()) return v.status();
        entry.values.push_back(*v);
        in.SkipSpace(true);
        if (in.Peek() == ',') {
          in.Advance();
        } else if (in.Peek() != ']') {
          if (in.AtEnd()) return in.ErrorAt(line, "unterminated array: expected ']'");
          return in.Error("expected ',' or ']' in the array");
        }
      }
    } else {
      if (in.AtEnd() || in.Peek() == '\n' || in.Peek() == '#' || in.Peek() == ';') {
        return in.Error(absl::StrCat("missing value after '", absl::StrJoin(*key, "."), " ='"));
      }
      auto v = in.Scalar(/*in_array=*/false);
      if (!v.ok()) return v.status();
      entry.values.push_back(*v);
    }
    if (auto st = in.EndOfLine(); !st.ok()) return st;
    const std::string full = JoinPath(entry.section, entry.key);
    if (auto [it, inserted] = seen.emplace(full, line); !inserted) {
      return in.ErrorAt(line, absl::StrCat("'", full, "' is set twice (first on line ",
                                           it->second, ")"));
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::string FormatEffectiveConfig(const CLI::App& app) {
  std::string name = app.get_name();
  name = name.substr(name.rfind('/') + 1);
  std::string out = absl::StrCat(
      "# ", name.empty() ? std::string("effective") : name,
      " configuration: set keys come from the config file or flags, commented keys are "
      "defaults\n");
  FormatApp(app, {}, &out);
  return out;
}

namespace {

// The variable's value before parsing is the default, also for options declared without
// capture_default_str(): --print-config and --help show it.
void CaptureDefaults(CLI::App* app) {
  for (CLI::Option* opt : OptionsOf(app)) {
    if (opt->get_default_str().empty() && opt->get_expected_min() != 0 &&
        opt->get_items_expected_max() <= 1) {
      opt->capture_default_str();
    }
  }
  for (CLI::App* sub : app->get_subcommands({})) CaptureDefaults(sub);
}

}  // namespace

void AddConfigFile(CLI::App& app) {
  auto state = std::make_shared<SharedState>();
  CaptureDefaults(&app);
  AddUnitChecks(&app);
  app.set_config("--config", "",
                 "read flags from this TOML/INI file (keys are the long flag names; flags on "
                 "the command line win)")
      ->expected(1);
  app.config_formatter(std::make_shared<StrataConfigFormatter>(&app, state));
  CLI::App* root = &app;
  app.add_flag_callback(
         "--print-config",
         [root] {
           // CLI11 runs this callback before it reports a config file it could not read (so
           // that --help wins over that error): the check before a restart must fail as the
           // restart would.
           const CLI::Option* config = root->get_config_ptr();
           if (config != nullptr && config->count() > 0) {
             const std::string path = config->as<std::string>();
             std::ifstream readable(path);
             if (!readable || std::filesystem::is_directory(path)) {
               throw CLI::FileError::Missing(path);
             }
           }
           RunCallbacks(root);
           std::cout << FormatEffectiveConfig(*root) << std::flush;
           throw CLI::Success();
         },
         "print the effective configuration (config file and flags) as a config file and exit")
      ->configurable(false);
  // CLI11 names the option in a bad value's message, not the file: add where it came from.
  auto previous = CLI::FailureMessage::simple;
  app.failure_message([state, previous](const CLI::App* app, const CLI::Error& e) {
    std::string message = previous(app, e);
    const std::string what = e.what();
    if (what.rfind(state->file + ":", 0) == 0) return message;  // already located
    for (const SharedState::Applied& applied : state->applied) {
      for (const std::string& name : applied.names) {
        if (MentionsName(what, name)) {
          return absl::StrCat(state->file, ":", applied.line, ": ", message);
        }
      }
    }
    return message;
  });
}

}  // namespace strata::base
