// `strata phases`: program phase changes the server detected for a service.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/format.h"

namespace strata::cli {
namespace {

int RunPhases(CliContext* ctx, const FilterOptions& f) {
  Client& client = ctx->client();
  v1::PhasesRequest request;
  *request.mutable_filter() = BuildFilter(f);
  auto r = client.Call(client.query(), &v1::Query::Stub::Phases, request);
  WarnUnreachable(r.unreachable_nodes());
  if (r.changes().empty()) FailIfUnknownService(client, f.service);
  if (ctx->options().json) return PrintJson(r), 0;
  std::printf("Phase changes of %s (%s): %d\n", f.service.c_str(), RangeText(f).c_str(),
              r.changes_size());
  int shown = 0;
  for (const auto& c : r.changes()) {
    if (shown++ == static_cast<int>(f.limit)) break;
    std::printf("\n%s (window %s%s)\n", FormatRfc3339(c.detected_ms()).c_str(),
                FormatRfc3339(c.window_start_ms()).c_str(),
                c.node().empty() ? "" : absl::StrCat(", node ", c.node()).c_str());
    Table table({"", "BEFORE", "AFTER", "PATH"}, {1, 2});
    for (const auto& s : c.rose()) {
      table.AddRow({"rose", WithThousands(s.count_before()), WithThousands(s.count_after()),
                    PathText(s.path())});
    }
    for (const auto& s : c.fell()) {
      table.AddRow({"fell", WithThousands(s.count_before()), WithThousands(s.count_after()),
                    PathText(s.path())});
    }
    std::fputs(table.ToString().c_str(), stdout);
  }
  return 0;
}

}  // namespace

void AddPhaseCommands(CLI::App* app, CliContext* ctx, int* exit_code) {
  static FilterOptions filter;
  filter.since = "1h";
  auto* phases = app->add_subcommand(
      "phases", "phase changes: the service's hot paths changed by an order of magnitude");
  AddFilterFlags(phases, &filter);
  phases->callback([=] { *exit_code = RunPhases(ctx, filter); });
}

}  // namespace strata::cli
