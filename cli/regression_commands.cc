// `strata regressions`: the releases the server found by itself and compared with the one
// before (server/regress), with their verdicts and the functions responsible.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/client.h"
#include "cli/format.h"
#include "common/base/clock.h"
#include "common/base/duration.h"
#include "strata/v1/regress.grpc.pb.h"

namespace strata::cli {
namespace {

struct RegressionOptions {
  std::string service;
  std::string since = "7d";
  bool all = false;  // unchanged and undecided releases too
};

std::string StateText(const v1::ReleaseVerdict& v) {
  switch (v.state()) {
    case v1::ReleaseVerdict::REGRESSED: return "REGRESSED";
    case v1::ReleaseVerdict::IMPROVED: return "improved";
    case v1::ReleaseVerdict::UNCHANGED: return "unchanged";
    default: return "not enough data";
  }
}

// A verdict's figures are shares (percent, deltas in points) or per request in its unit.
std::string MinDetectableText(const v1::ReleaseVerdict& v) {
  return v.unit().empty() ? absl::StrFormat("%.2f pt", v.min_detectable())
                          : absl::StrFormat("%.4g %s", v.min_detectable(), v.unit());
}
std::string FigureText(const v1::ReleaseVerdict& v, double figure) {
  return v.unit().empty() ? absl::StrFormat("%.2f%%", figure) : absl::StrFormat("%.4g", figure);
}

std::string ChangeText(const v1::ReleaseVerdict& v, const v1::ReleaseFunctionChange& f) {
  std::string text =
      v.unit().empty()
          ? absl::StrFormat("%+.2f pt [%+.2f, %+.2f]", f.delta(), f.ci_low(), f.ci_high())
          : absl::StrFormat("%+.4g [%+.4g, %+.4g] %s", f.delta(), f.ci_low(), f.ci_high(),
                            v.unit());
  absl::StrAppend(&text, f.self() ? " self" : " total");
  if (f.baseline_share() > 0) absl::StrAppendFormat(&text, " (%+.0f %%)", f.relative());
  return text;
}

// What the comparison took as units: hosts, or one host's windows ("60/12 of 60s": a phase
// change, or a release of a service that runs on one host).
std::string UnitsText(const v1::ReleaseVerdict& v) {
  std::string text = absl::StrCat(v.baseline_units(), "/", v.candidate_units());
  if (v.window_s() == 0) return absl::StrCat(text, " hosts");
  return absl::StrCat(text, " of ", v.window_s(), "s");
}

// A release value for the table: a long one (a build ID: 40 hex digits, a Go build ID's 80)
// by its first and last 8 characters, which tell two builds apart where a prefix may not.
std::string ShortValue(const std::string& value, bool shorten) {
  if (!shorten || value.size() <= 20) return value;
  return absl::StrCat(value.substr(0, 8), "..", value.substr(value.size() - 8));
}

// "version 1 -> 2", or "phase change (version 2)": a phase change of one release, compared
// from its start (the FIRST SEEN column) on with the time before. `shorten`: long values
// shortened (the table; the section of each regressed release names them in full).
std::string ComparedText(const v1::ReleaseVerdict& v, bool shorten = false) {
  if (v.kind() == v1::ReleaseVerdict::PHASE) {
    return v.label().empty() ? "phase change"
                             : absl::StrCat("phase change (", v.label(), " ",
                                            ShortValue(v.candidate(), shorten), ")");
  }
  return absl::StrCat(v.label(), " ", ShortValue(v.baseline(), shorten), " -> ",
                      ShortValue(v.candidate(), shorten));
}

// `word` as one shell word: quoted unless it is plain.
std::string ShellWord(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of(
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.,=:/@%+-") ==
      std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The verdict's which_lines request as the strata diff command that sends it.
std::string WhichLinesCommand(const v1::ReleaseVerdict& v) {
  const v1::DiffRequest& d = v.which_lines();
  std::string command = absl::StrCat("strata diff -s ", ShellWord(d.filter().service()),
                                     " --by line", d.language_self() ? " --language-self" : "");
  if (!d.base().selector().empty() || !d.filter().selector().empty()) {
    absl::StrAppend(&command, " --select-a ", ShellWord(d.base().selector()), " --select-b ",
                    ShellWord(d.filter().selector()));
  }
  absl::StrAppend(&command, " --from ", FormatRfc3339Millis(d.filter().range().from_ms()),
                  " --to ", FormatRfc3339Millis(d.filter().range().to_ms()), " --base-from ",
                  FormatRfc3339Millis(d.base().range().from_ms()), " --base-to ",
                  FormatRfc3339Millis(d.base().range().to_ms()));
  return command;
}

int RunRegressions(CliContext* ctx, const RegressionOptions& o) {
  absl::StatusOr<int64_t> since = base::ParseDuration(o.since);
  if (!since.ok() || *since <= 0) Fail(absl::StrCat("--since: '", o.since, "' is not a duration"));
  Client& client = ctx->client();
  v1::ListRegressionsRequest request;
  request.set_service(o.service);
  request.set_since_ms(std::max<int64_t>(0, base::NowMs() - *since));
  auto stub = v1::Regressions::NewStub(client.channel());
  auto r = client.Call(stub.get(), &v1::Regressions::Stub::ListRegressions, request);
  if (r.verdicts().empty()) FailIfUnknownService(client, o.service);
  if (ctx->options().json) return PrintJson(r), 0;
  WarnUnreachable(r.unreachable_nodes());

  Table table({"FIRST SEEN", "SERVICE", "RELEASE", "VERDICT", "UNITS", "MDE", "CAUSE"},
              {4, 5});
  int shown = 0;
  for (const v1::ReleaseVerdict& v : r.verdicts()) {
    if (!o.all && v.state() != v1::ReleaseVerdict::REGRESSED &&
        v.state() != v1::ReleaseVerdict::IMPROVED) {
      continue;
    }
    ++shown;
    table.AddRow({FormatRfc3339(v.first_seen_ms()), v.service(), ComparedText(v, true),
                  absl::StrCat(StateText(v), v.final() ? "" : " (so far)",
                               v.error().empty() ? "" : " (error)"),
                  UnitsText(v),
                  v.min_detectable() > 0 ? MinDetectableText(v) : "-",
                  v.functions_size() > 0
                      ? absl::StrCat(v.functions(0).name(), " ", ChangeText(v, v.functions(0)))
                      : "-"});
  }
  std::printf("Releases compared with the one before, and phase changes (since %s%s): %d of "
              "%d shown%s\n",
              o.since.c_str(), o.service.empty() ? "" : (", " + o.service).c_str(), shown,
              r.verdicts_size(), o.all ? "" : " (regressed or improved; --all for every one)");
  if (shown == 0) return 0;
  std::fputs(table.ToString().c_str(), stdout);
  // The functions responsible, per regressed release.
  for (const v1::ReleaseVerdict& v : r.verdicts()) {
    if (v.state() != v1::ReleaseVerdict::REGRESSED) continue;
    std::printf("\n%s %s: %s, baseline -> candidate\n", v.service().c_str(),
                ComparedText(v).c_str(),
                v.unit().empty() ? "share of the service's CPU" : v.unit().c_str());
    Table functions({"FUNCTION", "BASELINE", "CANDIDATE", "CHANGE", "Q"}, {1, 2, 4});
    for (const v1::ReleaseFunctionChange& f : v.functions()) {
      functions.AddRow({f.name(), FigureText(v, f.baseline_share()),
                        FigureText(v, f.candidate_share()), ChangeText(v, f),
                        absl::StrFormat("%.2g", f.q())});
    }
    std::fputs(functions.ToString().c_str(), stdout);
    if (v.has_which_lines()) std::printf("Which lines: %s\n", WhichLinesCommand(v).c_str());
  }
  return 0;
}

}  // namespace

void AddRegressionCommands(CLI::App* app, CliContext* ctx, int* exit_code) {
  static RegressionOptions options;
  auto* regressions = app->add_subcommand(
      "regressions",
      "releases (and phase changes) the server compared with the time before by itself: which "
      "got slower");
  regressions->add_option("-s,--service", options.service, "only this service's releases");
  regressions->add_option("--since", options.since, "releases first seen this recently")
      ->capture_default_str();
  regressions->add_flag("--all", options.all, "unchanged and undecided releases too");
  regressions->callback([=] { *exit_code = RunRegressions(ctx, options); });
}

}  // namespace strata::cli
