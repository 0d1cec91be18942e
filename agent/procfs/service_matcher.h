// Decides which processes the agent profiles and under which service name.
//
// Rules come from `--service NAME=REGEX` flags, in flag order. A process may also name itself
// with the STRATA_SERVICE environment variable, which wins over the rules: whoever deployed the
// process knows its service better than a host-wide regex. A rule matches when its regex is
// found (unanchored search, RE2 syntax) in the executable's basename or in the command line
// (argv joined with single spaces); anchor with ^ and $ to require a whole-name match. The
// first matching rule wins. The matcher owns its compiled regexes and is immutable after
// Create(), so it can be shared freely.

#ifndef STRATA_AGENT_PROCFS_SERVICE_MATCHER_H_
#define STRATA_AGENT_PROCFS_SERVICE_MATCHER_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace re2 {
class RE2;
}

namespace strata::agent::procfs {

inline constexpr std::string_view kServiceEnvVar = "STRATA_SERVICE";

struct ServiceRule {
  std::string service;
  std::string regex;
};

// Parses "NAME=REGEX" (the first '=' separates; the regex may contain '='). The name must be
// non-empty and the regex must compile.
absl::StatusOr<ServiceRule> ParseServiceRule(std::string_view flag_value);

// What the matcher looks at for one process.
struct ProcessIdentity {
  std::string executable;                // /proc/PID/exe target (may end in " (deleted)")
  std::vector<std::string> command_line;  // argv
  std::optional<std::string> env_service;  // STRATA_SERVICE, if set
};

class ServiceMatcher {
 public:
  // `use_env_var`: honour STRATA_SERVICE. Fails if a rule has an empty name or a bad regex.
  static absl::StatusOr<ServiceMatcher> Create(std::vector<ServiceRule> rules,
                                               bool use_env_var = true);

  ServiceMatcher(ServiceMatcher&&) noexcept;
  ServiceMatcher& operator=(ServiceMatcher&&) noexcept;
  ~ServiceMatcher();

  // Service name for the process, or nullopt if it is not a target.
  std::optional<std::string> Match(const ProcessIdentity& process) const;

  // True if Match() may need the environment (saves reading /proc/PID/environ otherwise).
  bool uses_env_var() const { return use_env_var_; }

  // True if Match() is nullopt for every process (no rules, no STRATA_SERVICE): only pinned
  // processes (`--pid`) can be targets, and nothing else needs to be read.
  bool matches_nothing() const { return rules_.empty() && !use_env_var_; }

 private:
  struct CompiledRule;
  ServiceMatcher(std::vector<CompiledRule> rules, bool use_env_var);

  std::vector<CompiledRule> rules_;
  bool use_env_var_;
};

// Basename of an executable path, without the kernel's " (deleted)" suffix.
std::string_view ExecutableBasename(std::string_view executable);

}  // namespace strata::agent::procfs

#endif  // STRATA_AGENT_PROCFS_SERVICE_MATCHER_H_
