#include "agent/procfs/service_matcher.h"

#include "gtest/gtest.h"

namespace strata::agent::procfs {
namespace {

TEST(ParseServiceRuleTest, SplitsAtFirstEquals) {
  ServiceRule rule = ParseServiceRule("api=^api-server$").value();
  EXPECT_EQ(rule.service, "api");
  EXPECT_EQ(rule.regex, "^api-server$");
  rule = ParseServiceRule("cfg=--mode=fast").value();
  EXPECT_EQ(rule.service, "cfg");
  EXPECT_EQ(rule.regex, "--mode=fast");
}

TEST(ParseServiceRuleTest, RejectsBadRules) {
  EXPECT_EQ(ParseServiceRule("no-equals").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseServiceRule("=regex").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseServiceRule("bad=(unclosed").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ServiceMatcher::Create({{"x", "[z-a]"}}).ok());
  EXPECT_FALSE(ServiceMatcher::Create({{"", "ok"}}).ok());
}

TEST(ExecutableBasenameTest, StripsDirectoryAndDeletedSuffix) {
  EXPECT_EQ(ExecutableBasename("/usr/bin/redis-server"), "redis-server");
  EXPECT_EQ(ExecutableBasename("/opt/app/bin/app (deleted)"), "app");
  EXPECT_EQ(ExecutableBasename("bare"), "bare");
  EXPECT_EQ(ExecutableBasename(""), "");
}

ProcessIdentity Process(std::string exe, std::vector<std::string> argv,
                        std::optional<std::string> env = std::nullopt) {
  return ProcessIdentity{std::move(exe), std::move(argv), std::move(env)};
}

TEST(ServiceMatcherTest, MatchesBasenameOrCommandLineFirstRuleWins) {
  ServiceMatcher matcher = ServiceMatcher::Create({
                                                      {"redis", "^redis-server$"},
                                                      {"billing", "java .*-jar billing\\.jar"},
                                                      {"any-python", "python3"},
                                                  })
                               .value();
  EXPECT_EQ(matcher.Match(Process("/usr/bin/redis-server", {"redis-server", "*:6379"})),
            "redis");
  // Anchored rule: a longer basename does not match it.
  EXPECT_EQ(matcher.Match(Process("/usr/bin/redis-server-helper", {"helper"})), std::nullopt);
  // Deleted (upgraded in place) executables still match by name.
  EXPECT_EQ(matcher.Match(Process("/usr/bin/redis-server (deleted)", {"x"})), "redis");
  EXPECT_EQ(matcher.Match(Process("/usr/lib/jvm/bin/java",
                                  {"java", "-Xmx1g", "-jar", "billing.jar", "--port=1"})),
            "billing");
  EXPECT_EQ(matcher.Match(Process("/usr/lib/jvm/bin/java", {"java", "-jar", "other.jar"})),
            std::nullopt);
  // An unanchored rule matches inside a longer basename.
  EXPECT_EQ(matcher.Match(Process("/usr/bin/python3.11", {"python3", "serve.py"})),
            "any-python");
  EXPECT_EQ(matcher.Match(Process("", {})), std::nullopt);
}

TEST(ServiceMatcherTest, EnvironmentVariableLabelsAndWins) {
  ServiceMatcher matcher = ServiceMatcher::Create({{"redis", "redis"}}).value();
  EXPECT_EQ(matcher.Match(Process("/usr/bin/redis-server", {}, "cache-eu")), "cache-eu");
  EXPECT_EQ(matcher.Match(Process("/usr/bin/worker", {"worker"}, "jobs")), "jobs");
  // Empty value is not a label.
  EXPECT_EQ(matcher.Match(Process("/usr/bin/worker", {"worker"}, "")), std::nullopt);
  EXPECT_TRUE(matcher.uses_env_var());

  ServiceMatcher no_env = ServiceMatcher::Create({{"redis", "redis"}}, false).value();
  EXPECT_FALSE(no_env.uses_env_var());
  EXPECT_EQ(no_env.Match(Process("/usr/bin/worker", {"worker"}, "jobs")), std::nullopt);
  EXPECT_EQ(no_env.Match(Process("/usr/bin/redis-server", {}, "cache-eu")), "redis");
}

TEST(ServiceMatcherTest, MovedMatcherKeepsRules) {
  ServiceMatcher a = ServiceMatcher::Create({{"x", "^x$"}}).value();
  ServiceMatcher b = std::move(a);
  EXPECT_EQ(b.Match(Process("/bin/x", {})), "x");
}

}  // namespace
}  // namespace strata::agent::procfs
