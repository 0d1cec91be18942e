// Config files for the Strata binaries: `--config FILE` gives every flag of a CLI11 app a key
// in a TOML (or INI-style) file, and `--print-config` shows the effective configuration.
//
//   listen = "0.0.0.0:7070"          # a flag's long name without the dashes
//   sync = true                      # flags take true/false
//   service = ["a=^a$", "b=^b$"]     # repeatable flags take arrays
//   [backup]                         # a subcommand's flags go in its section
//   keep = 3
//
// Flags on the command line override the file, and the file overrides environment defaults.
// The file is checked before CLI11 sees it, so every mistake is reported as FILE:LINE: an
// unknown key, a key given twice, a syntax error, and a value the flag refuses (its type,
// range or choices; an option whose default is written with a size unit, "512MiB", takes a
// byte size, and one whose default is a duration, "7d", a duration).
//
// One call in each main(), after the options are declared and before CLI11_PARSE. CLI11 reports
// errors by exceptions: they stay inside CLI11's parse, and CLI11_PARSE turns them into the
// message and exit status.
#ifndef STRATA_COMMON_BASE_CONFIG_FILE_H_
#define STRATA_COMMON_BASE_CONFIG_FILE_H_

#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"

namespace strata::base {

// Adds `--config FILE` and `--print-config` to `app` (and its subcommands' flags to the file).
void AddConfigFile(CLI::App& app);

// One `key = value` of a config file.
struct ConfigEntry {
  std::vector<std::string> section;  // subcommand path: [backup] -> {"backup"}
  std::string key;
  std::vector<std::string> values;  // one per array element; a scalar is one value
  bool array = false;
  int line = 0;  // 1-based
};

// Parses the TOML subset Strata reads: comments (# or ;), [section] and [a.b] headers, dotted
// keys, basic and literal strings, bare scalars (numbers, booleans, INI-style words), arrays
// (on one or several lines). Errors are InvalidArgument "FILE:LINE: what".
absl::StatusOr<std::vector<ConfigEntry>> ParseConfigText(std::string_view text,
                                                         std::string_view file_name);

// The effective configuration of a parsed app, as a file ParseConfigText reads: options set by
// a file or a flag as `key = value` lines, the others as commented defaults; each preceded by
// its description and a "#   type: " comment ("UINT:INT in [1 - 10000]", "flag", "TEXT,
// repeatable", "TEXT:SIZE").
std::string FormatEffectiveConfig(const CLI::App& app);

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_CONFIG_FILE_H_
