// strata compare: which differences between two groups of a service's hosts (a baseline and
// a candidate selector, over one range or two) are larger than the spread between hosts.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "cli/client.h"
#include "cli/format.h"

namespace strata::cli {
namespace {

struct CompareOptions {
  FilterOptions shared;             // service, range and filters of both groups
  std::string baseline, candidate;  // selectors
  // A group's own range (RFC 3339 or a look-back), else the shared one.
  std::string baseline_since, baseline_from, baseline_to;
  std::string candidate_since, candidate_from, candidate_to;
  std::string window = "60s";
  bool windows_independent = false;
  bool language_self = false;
  double fdr = 0.05;
  double confidence = 0.95;
  double min_share = 0.1;  // percent
  uint64_t baseline_requests = 0, candidate_requests = 0;
};

// One group's filter: the shared one with the group's selector and, when given, its range.
v1::ProfileFilter GroupFilter(const CompareOptions& o, const std::string& selector,
                              const std::string& since, const std::string& from,
                              const std::string& to, FilterOptions* group) {
  *group = o.shared;
  group->select = selector;
  if (!since.empty() || !from.empty()) {
    group->since = since.empty() ? group->since : since;
    group->from = from;
    group->to = to;
  }
  return BuildFilter(*group);
}

std::string Points(double v) { return absl::StrFormat("%+.2f", v); }
std::string Interval(const v1::CompareEstimate& e, bool enough) {
  return enough ? absl::StrFormat("[%+.2f, %+.2f]", e.ci_low(), e.ci_high()) : "-";
}
// "new" only for what the candidate has and the baseline has not: a function with no self
// time in either group (its samples are all in its callees) has no change to show.
std::string Relative(const v1::CompareEstimate& e) {
  if (e.share_baseline() != 0) return absl::StrFormat("%+.1f%%", e.relative());
  return e.share_candidate() == 0 ? "-" : "new";
}
std::string RelativeInterval(const v1::CompareEstimate& e, bool enough) {
  if (!enough || e.share_baseline() == 0) return "-";
  return absl::StrFormat("[%+.1f, %+.1f]", e.relative_ci_low(), e.relative_ci_high());
}
std::string Q(const v1::CompareEstimate& e) {
  return e.tested() ? absl::StrFormat("%.3g", e.q()) : "-";
}

// A function's self per request, in the response's per_request_unit.
std::vector<std::string> PerRequestRow(const v1::FunctionComparison& f, bool enough) {
  const v1::PerRequestEstimate& e = f.self().per_request();
  const v1::PerRequestEstimate& t = f.total().per_request();
  return {e.significant() ? "*" : (t.significant() ? "t" : ""),
          absl::StrFormat("%+.4g", e.delta()),
          enough ? absl::StrFormat("[%+.4g, %+.4g]", e.ci_low(), e.ci_high()) : "-",
          e.baseline() != 0   ? absl::StrFormat("%+.1f%%", e.relative())
          : e.candidate() == 0 ? "-"
                               : "new",
          e.tested() ? absl::StrFormat("%.3g", e.q()) : "-",
          absl::StrFormat("%.4g", e.baseline()),
          absl::StrFormat("%.4g", e.candidate()),
          absl::StrFormat("%+.4g", t.delta()),
          t.tested() ? absl::StrFormat("%.3g", t.q()) : "-",
          FrameText(f.function())};
}

int RunCompare(CliContext* ctx, const CompareOptions& o) {
  Client& client = ctx->client();
  v1::CompareRequest request;
  request.set_service(o.shared.service);
  FilterOptions b, c;
  *request.mutable_baseline() =
      GroupFilter(o, o.baseline, o.baseline_since, o.baseline_from, o.baseline_to, &b);
  *request.mutable_candidate() =
      GroupFilter(o, o.candidate, o.candidate_since, o.candidate_from, o.candidate_to, &c);
  auto window = ParseDuration(o.window);
  if (!window.ok() || *window < 1000) Fail("--window: a duration of at least 1s, e.g. 60s");
  request.set_window_s(static_cast<uint32_t>(*window / 1000));
  request.set_windows_independent(o.windows_independent);
  request.set_language_self(o.language_self);
  if (!(o.fdr > 0 && o.fdr < 1)) Fail("--fdr: a number in (0, 1), e.g. 0.05");
  request.set_fdr(o.fdr);
  if (!(o.confidence > 0 && o.confidence < 1)) Fail("--confidence: a number in (0, 1), e.g. 0.95");
  request.set_confidence(o.confidence);
  if (!(o.min_share > 0 && o.min_share < 100)) Fail("--min-share: a percentage, e.g. 0.1");
  request.set_min_share(o.min_share);
  request.set_limit(o.shared.limit);
  request.set_baseline_requests(o.baseline_requests);
  request.set_candidate_requests(o.candidate_requests);
  auto r = client.Call(client.query(), &v1::Query::Stub::Compare, request);
  WarnUnreachable(r.unreachable_nodes());
  if (ctx->options().json) return PrintJson(r), 0;

  auto group = [](const FilterOptions& f, uint32_t hosts, uint64_t samples) {
    return absl::StrFormat("%s {%s} (%s, %u hosts, %s samples)", f.service, f.select, RangeText(f),
                           hosts, WithThousands(samples));
  };
  std::printf("Compare %s\n   with %s\n",
              group(c, r.candidate_hosts(), r.candidate_samples()).c_str(),
              group(b, r.baseline_hosts(), r.baseline_samples()).c_str());
  const std::string units = r.window_s() == 0
                                ? "units are hosts"
                                : absl::StrFormat("units are %us windows of a host", r.window_s());
  std::printf("%s: %u baseline, %u candidate\n", units.c_str(), r.baseline_units(),
              r.candidate_units());
  for (const std::string& note : r.notes()) std::printf("note: %s\n", note.c_str());
  if (r.baseline_samples_per_request() > 0) {
    std::printf("requests: %s baseline, %s candidate (%s)\n",
                WithThousands(r.baseline_requests()).c_str(),
                WithThousands(r.candidate_requests()).c_str(),
                r.per_request_unit().empty() ? "as given" : "scraped by the agents");
    std::printf("samples per request: %.4g baseline, %.4g candidate (%+.1f%%)\n",
                r.baseline_samples_per_request(), r.candidate_samples_per_request(),
                100 * (r.candidate_samples_per_request() / r.baseline_samples_per_request() - 1));
    if (r.sampling_hz() > 0) {
      std::printf("CPU per request at %u Hz: %.4g ms baseline, %.4g ms candidate\n",
                  r.sampling_hz(), 1000 * r.baseline_samples_per_request() / r.sampling_hz(),
                  1000 * r.candidate_samples_per_request() / r.sampling_hz());
    }
  }
  const bool enough = !r.not_enough_data();
  if (!enough) {
    std::printf(
        "Not enough data: a group has fewer than two units with samples; shares only, "
        "no intervals and no verdicts.\n");
  } else {
    std::printf(
        "* = significant at a false discovery rate of %.3g over the %u function rows, and "
        "apart over the %u path rows, above %.3g %% of the samples (Benjamini-Hochberg); "
        "shares and deltas in percent of each group's samples, intervals %.3g %%, REL = "
        "change of the row's own CPU\n",
        r.fdr(), r.keys_compared(), r.paths_compared(), o.min_share, 100 * o.confidence);
  }
  std::printf("\nFunctions:\n");
  Table functions({"", "ΔSELF", "INTERVAL", "REL", "REL INTERVAL", "q", "BASE SELF%", "SELF%",
                   "MDE", "ΔTOTAL", "q TOTAL", "FUNCTION"},
                  {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  for (const auto& f : r.functions()) {
    const v1::CompareEstimate& s = f.self();
    const v1::CompareEstimate& t = f.total();
    functions.AddRow({s.significant() ? "*" : (t.significant() ? "t" : ""), Points(s.delta()),
                      Interval(s, enough), Relative(s), RelativeInterval(s, enough), Q(s),
                      absl::StrFormat("%.2f", s.share_baseline()),
                      absl::StrFormat("%.2f", s.share_candidate()),
                      enough ? absl::StrFormat("%.2f", s.min_detectable()) : "-", Points(t.delta()),
                      Q(t), FrameText(f.function())});
  }
  std::fputs(functions.ToString().c_str(), stdout);
  if (!r.per_request_unit().empty()) {
    std::printf(
        "\nFunctions per request (%s%s; * = significant per request, Benjamini-Hochberg of "
        "its own):\n",
        r.per_request_unit().c_str(),
        r.sampling_hz() > 0 ? "" : ": the sampling rate is not known, samples are not CPU time");
    Table per_request({"", "ΔSELF", "INTERVAL", "REL", "q", "BASE SELF", "SELF", "ΔTOTAL",
                       "q TOTAL", "FUNCTION"},
                      {1, 2, 3, 4, 5, 6, 7, 8});
    for (const auto& f : r.functions()) per_request.AddRow(PerRequestRow(f, enough));
    std::fputs(per_request.ToString().c_str(), stdout);
  }
  std::printf("\nPaths:\n");
  Table paths({"", "Δ", "INTERVAL", "REL", "q", "BASE%", "NOW%", "PATH"}, {1, 2, 3, 4, 5, 6});
  for (const auto& p : r.paths()) {
    const v1::CompareEstimate& e = p.samples();
    paths.AddRow({e.significant() ? "*" : "", Points(e.delta()), Interval(e, enough), Relative(e),
                  Q(e), absl::StrFormat("%.2f", e.share_baseline()),
                  absl::StrFormat("%.2f", e.share_candidate()), PathText(p)});
  }
  std::fputs(paths.ToString().c_str(), stdout);
  return 0;
}

}  // namespace

void AddCompareCommand(CLI::App* app, CliContext* ctx, int* exit_code) {
  static CompareOptions o;
  auto* cmd = app->add_subcommand(
      "compare", "which differences between two groups of hosts are real (intervals, q-values)");
  AddFilterFlags(cmd, &o.shared);
  cmd->remove_option(cmd->get_option("--select"));
  cmd->add_option("--baseline", o.baseline, "baseline targets' selector, e.g. version=1")
      ->required();
  cmd->add_option("--candidate", o.candidate, "candidate targets' selector, e.g. version=2")
      ->required();
  for (auto [name, since, from, to] :
       {std::tuple{"baseline", &o.baseline_since, &o.baseline_from, &o.baseline_to},
        std::tuple{"candidate", &o.candidate_since, &o.candidate_from, &o.candidate_to}}) {
    cmd->add_option(absl::StrCat("--", name, "-since"), *since,
                    absl::StrCat("the ", name, "'s own look-back (default: --since)"));
    cmd->add_option(absl::StrCat("--", name, "-from"), *from,
                    absl::StrCat("the ", name, "'s own range start, RFC 3339"));
    cmd->add_option(absl::StrCat("--", name, "-to"), *to,
                    absl::StrCat("the ", name, "'s own range end, RFC 3339, exclusive"));
  }
  cmd->add_option("--window", o.window, "a unit's window with --windows-independent (e.g. 60s)")
      ->capture_default_str();
  cmd->add_flag("--windows-independent", o.windows_independent,
                "each window of a host is a unit of its own (only when hosts do not differ "
                "lastingly; by default a unit is a host over the range)");
  cmd->add_flag("--language-self", o.language_self,
                "a Python or Java function's self samples include the interpreter's or JVM's "
                "native code it calls (as release verdicts count them)");
  cmd->add_option("--fdr", o.fdr, "false discovery rate (Benjamini-Hochberg)")
      ->capture_default_str();
  cmd->add_option("--confidence", o.confidence, "of the intervals")->capture_default_str();
  cmd->add_option("--min-share", o.min_share,
                  "rows below this percentage of the samples are shown but not tested")
      ->capture_default_str();
  cmd->add_option("--baseline-requests", o.baseline_requests,
                  "requests the baseline served over its range (for samples per request; "
                  "replaces the counts the agents scraped with --requests-metric)");
  cmd->add_option("--candidate-requests", o.candidate_requests,
                  "requests the candidate served over its range");
  cmd->footer(
      "Rows marked * differ by more than the spread between hosts explains; REL is the change "
      "of the row's own CPU share (+10% = a tenth more). MDE is the smallest change these "
      "hosts could have shown. Where every host's agent scraped its requests "
      "(strata-agent --requests-metric), each function is also compared per request. See "
      "docs/using/queries.md.");
  cmd->callback([=] { *exit_code = RunCompare(ctx, o); });
}

}  // namespace strata::cli
