// Query commands: services, agents, top, hot-paths.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/format.h"

namespace strata::cli {
namespace {

std::string ArchSuffix(const google::protobuf::RepeatedPtrField<std::string>& archs) {
  if (archs.empty()) return "";
  return absl::StrCat(", ", absl::StrJoin(archs, "+"));
}

int RunServices(CliContext* ctx) {
  Client& client = ctx->client();
  auto r = client.Call(client.query(), &v1::Query::Stub::ListServices, v1::ListServicesRequest());
  if (ctx->options().json) return PrintJson(r), 0;
  if (r.services().empty()) {
    std::printf("No services have reported samples yet.\n");
    return 0;
  }
  Table table({"SERVICE", "SAMPLES", "FIRST SEEN", "LAST SEEN"}, {1});
  for (const auto& s : r.services()) {
    table.AddRow({s.name(), WithThousands(s.total_samples()), FormatRfc3339(s.first_ms()),
                  FormatRfc3339(s.last_ms())});
  }
  std::fputs(table.ToString().c_str(), stdout);
  return 0;
}

int RunAgents(CliContext* ctx) {
  Client& client = ctx->client();
  auto r = client.Call(client.query(), &v1::Query::Stub::ListAgents, v1::ListAgentsRequest());
  if (ctx->options().json) return PrintJson(r), 0;
  if (r.agents().empty()) {
    std::printf("No agents have connected since the server started.\n");
    return 0;
  }
  Table table({"AGENT", "HOST", "ARCH", "VERSION", "STATE", "BATCHES", "LAST BATCH", "TARGETS"},
              {5});
  for (const auto& a : r.agents()) {
    table.AddRow({a.agent_id(), a.host(), a.arch(), a.version(),
                  a.connected() ? "connected" : "gone", WithThousands(a.batches()),
                  a.last_batch_ms() ? FormatRfc3339(a.last_batch_ms()) : "-",
                  absl::StrJoin(a.targets(), ",")});
  }
  std::fputs(table.ToString().c_str(), stdout);
  return 0;
}

int RunTop(CliContext* ctx, const FilterOptions& f, bool by_total) {
  Client& client = ctx->client();
  v1::TopRequest request;
  *request.mutable_filter() = BuildFilter(f);
  request.set_limit(f.limit);
  request.set_sort(by_total ? v1::TopRequest::TOTAL : v1::TopRequest::SELF);
  auto r = client.Call(client.query(), &v1::Query::Stub::Top, request);
  if (ctx->options().json) return PrintJson(r), 0;
  std::printf("Top functions of %s (%s, %s samples%s)\n", f.service.c_str(),
              RangeText(f).c_str(), WithThousands(r.total_samples()).c_str(),
              ArchSuffix(r.archs()).c_str());
  if (r.total_samples() == 0) {
    std::printf("No samples in this range.\n");
    return 0;
  }
  Table table({"SELF", "SELF%", "TOTAL", "TOTAL%", "FUNCTION", "MODULE"}, {0, 1, 2, 3});
  for (const auto& fn : r.functions()) {
    table.AddRow({WithThousands(fn.self()), Percent(fn.self(), r.total_samples()),
                  WithThousands(fn.total()), Percent(fn.total(), r.total_samples()),
                  fn.function().function(), fn.function().module()});
  }
  std::fputs(table.ToString().c_str(), stdout);
  return 0;
}

int RunHotPaths(CliContext* ctx, const FilterOptions& f) {
  Client& client = ctx->client();
  v1::HotPathsRequest request;
  *request.mutable_filter() = BuildFilter(f);
  request.set_limit(f.limit);
  auto r = client.Call(client.query(), &v1::Query::Stub::HotPaths, request);
  if (ctx->options().json) return PrintJson(r), 0;
  std::printf("Hot paths of %s (%s, %s samples%s)\n", f.service.c_str(), RangeText(f).c_str(),
              WithThousands(r.total_samples()).c_str(), ArchSuffix(r.archs()).c_str());
  if (r.total_samples() == 0) {
    std::printf("No samples in this range.\n");
    return 0;
  }
  Table table({"SAMPLES", "%", "PATH"}, {0, 1});
  for (const auto& p : r.paths()) {
    std::vector<std::string> names;
    if (p.truncated()) names.push_back("[truncated]");
    for (const auto& frame : p.frames()) names.push_back(frame.function());
    table.AddRow({WithThousands(p.samples()), Percent(p.samples(), r.total_samples()),
                  absl::StrJoin(names, " > ")});
  }
  std::fputs(table.ToString().c_str(), stdout);
  return 0;
}

}  // namespace

void AddQueryCommands(CLI::App* app, CliContext* ctx, int* exit_code) {
  app->add_subcommand("services", "list services with samples")
      ->callback([=] { *exit_code = RunServices(ctx); });
  app->add_subcommand("agents", "list agents known to the server")
      ->callback([=] { *exit_code = RunAgents(ctx); });

  static FilterOptions top_filter, paths_filter;
  static std::string sort = "self";
  auto* top = app->add_subcommand("top", "functions by self or total samples");
  AddFilterFlags(top, &top_filter);
  top->add_option("--sort", sort, "self or total")
      ->check(CLI::IsMember({"self", "total"}))
      ->capture_default_str();
  top->callback([=] { *exit_code = RunTop(ctx, top_filter, sort == "total"); });

  auto* hot_paths = app->add_subcommand("hot-paths", "hottest full call paths");
  AddFilterFlags(hot_paths, &paths_filter);
  hot_paths->callback([=] { *exit_code = RunHotPaths(ctx, paths_filter); });
}

}  // namespace strata::cli
