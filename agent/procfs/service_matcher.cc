#include "agent/procfs/service_matcher.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "re2/re2.h"

namespace strata::agent::procfs {

struct ServiceMatcher::CompiledRule {
  std::string service;
  std::unique_ptr<re2::RE2> regex;
};

namespace {

absl::StatusOr<std::unique_ptr<re2::RE2>> Compile(const ServiceRule& rule) {
  if (rule.service.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("service rule '=", rule.regex,
                                                   "': empty service name"));
  }
  RE2::Options options;
  options.set_log_errors(false);
  auto regex = std::make_unique<re2::RE2>(rule.regex, options);
  if (!regex->ok()) {
    return absl::InvalidArgumentError(absl::StrCat("service rule '", rule.service, "=",
                                                   rule.regex, "': ", regex->error()));
  }
  return regex;
}

}  // namespace

absl::StatusOr<ServiceRule> ParseServiceRule(std::string_view flag_value) {
  size_t eq = flag_value.find('=');
  if (eq == std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("service rule '", std::string(flag_value), "': expected NAME=REGEX"));
  }
  ServiceRule rule{std::string(flag_value.substr(0, eq)), std::string(flag_value.substr(eq + 1))};
  absl::StatusOr<std::unique_ptr<re2::RE2>> compiled = Compile(rule);
  if (!compiled.ok()) return compiled.status();
  return rule;
}

std::string_view ExecutableBasename(std::string_view executable) {
  constexpr std::string_view kDeleted = " (deleted)";
  if (executable.ends_with(kDeleted)) executable.remove_suffix(kDeleted.size());
  size_t slash = executable.rfind('/');
  return slash == std::string_view::npos ? executable : executable.substr(slash + 1);
}

absl::StatusOr<ServiceMatcher> ServiceMatcher::Create(std::vector<ServiceRule> rules,
                                                      bool use_env_var) {
  std::vector<CompiledRule> compiled;
  compiled.reserve(rules.size());
  for (ServiceRule& rule : rules) {
    absl::StatusOr<std::unique_ptr<re2::RE2>> regex = Compile(rule);
    if (!regex.ok()) return regex.status();
    compiled.push_back(CompiledRule{std::move(rule.service), std::move(*regex)});
  }
  return ServiceMatcher(std::move(compiled), use_env_var);
}

ServiceMatcher::ServiceMatcher(std::vector<CompiledRule> rules, bool use_env_var)
    : rules_(std::move(rules)), use_env_var_(use_env_var) {}
ServiceMatcher::ServiceMatcher(ServiceMatcher&&) noexcept = default;
ServiceMatcher& ServiceMatcher::operator=(ServiceMatcher&&) noexcept = default;
ServiceMatcher::~ServiceMatcher() = default;

std::optional<std::string> ServiceMatcher::Match(const ProcessIdentity& process) const {
  if (use_env_var_ && process.env_service.has_value() && !process.env_service->empty()) {
    return *process.env_service;
  }
  if (rules_.empty()) return std::nullopt;
  std::string_view basename = ExecutableBasename(process.executable);
  std::string command_line = absl::StrJoin(process.command_line, " ");
  for (const CompiledRule& rule : rules_) {
    if ((!basename.empty() && RE2::PartialMatch(basename, *rule.regex)) ||
        (!command_line.empty() && RE2::PartialMatch(command_line, *rule.regex))) {
      return rule.service;
    }
  }
  return std::nullopt;
}

}  // namespace strata::agent::procfs
