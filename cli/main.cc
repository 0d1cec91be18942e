// strata: the command-line client. Talks to strata-server's Query service over gRPC.
//
//   strata [--server ADDR] [--json] services | agents
//   strata top       --service S [--since 10m | --from T --to T] [--limit N] [--sort self|total]
//   strata hot-paths --service S [--since 10m | --from T --to T] [--limit N]
// Common filters: --host H, --focus REGEX, --ignore REGEX.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/format.h"
#include "strata/v1/query.grpc.pb.h"

namespace strata::cli {
namespace {

struct GlobalOptions {
  std::string server;
  bool json = false;
  int timeout_s = 30;
};

struct FilterOptions {
  std::string service;
  std::string since = "10m";
  std::string from, to;
  std::string host, focus, ignore;
  uint32_t limit = 20;
};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "strata: %s\n", message.c_str());
  std::exit(1);
}

void AddFilterFlags(CLI::App* cmd, FilterOptions* f, bool service_required = true) {
  auto* service = cmd->add_option("--service,-s", f->service, "service name");
  if (service_required) service->required();
  cmd->add_option("--since", f->since, "look back this far (e.g. 30s, 10m, 1h, 7d)")
      ->capture_default_str();
  cmd->add_option("--from", f->from, "range start, RFC 3339 (overrides --since)");
  cmd->add_option("--to", f->to, "range end, RFC 3339 (default: now)");
  cmd->add_option("--host", f->host, "only samples from this host");
  cmd->add_option("--focus", f->focus, "keep stacks with a function matching this regex");
  cmd->add_option("--ignore", f->ignore, "drop stacks with a function matching this regex");
  cmd->add_option("--limit,-n", f->limit, "rows to show")->capture_default_str();
}

v1::ProfileFilter BuildFilter(const FilterOptions& f) {
  v1::ProfileFilter filter;
  filter.set_service(f.service);
  filter.set_host(f.host);
  filter.set_focus(f.focus);
  filter.set_ignore(f.ignore);
  const int64_t now = NowMs();
  int64_t to = now;
  if (!f.to.empty()) {
    auto t = ParseRfc3339(f.to);
    if (!t.ok()) Fail(std::string(t.status().message()));
    to = *t;
  }
  int64_t from;
  if (!f.from.empty()) {
    auto t = ParseRfc3339(f.from);
    if (!t.ok()) Fail(std::string(t.status().message()));
    from = *t;
  } else {
    auto d = ParseDuration(f.since);
    if (!d.ok()) Fail(std::string(d.status().message()));
    from = to - *d;
  }
  if (from >= to) Fail("--from must be before --to");
  filter.mutable_range()->set_from_ms(from);
  filter.mutable_range()->set_to_ms(to + 1);
  return filter;
}

std::string RangeText(const FilterOptions& f) {
  if (!f.from.empty()) return absl::StrCat(f.from, " .. ", f.to.empty() ? "now" : f.to);
  return absl::StrCat("last ", f.since);
}

class Client {
 public:
  explicit Client(const GlobalOptions& options) : options_(options) {
    channel_ = grpc::CreateChannel(options.server, grpc::InsecureChannelCredentials());
    query_ = v1::Query::NewStub(channel_);
  }

  template <typename Request, typename Response, typename Method>
  Response Call(Method method, const Request& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(options_.timeout_s));
    Response response;
    grpc::Status status = (query_.get()->*method)(&context, request, &response);
    if (!status.ok()) {
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
          status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        Fail(absl::StrCat("cannot reach strata-server at ", options_.server, ": ",
                          status.error_message(),
                          " (is the server running? set --server or STRATA_SERVER)"));
      }
      Fail(status.error_message());
    }
    return response;
  }

 private:
  GlobalOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Query::Stub> query_;
};

void PrintJson(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  std::fputs(out.c_str(), stdout);
}

std::string ArchSuffix(const google::protobuf::RepeatedPtrField<std::string>& archs) {
  if (archs.empty()) return "";
  return absl::StrCat(", ", absl::StrJoin(archs, "+"));
}

int RunServices(Client& client, const GlobalOptions& g) {
  auto r = client.Call<v1::ListServicesRequest, v1::ListServicesResponse>(
      &v1::Query::Stub::ListServices, v1::ListServicesRequest());
  if (g.json) return PrintJson(r), 0;
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

int RunAgents(Client& client, const GlobalOptions& g) {
  auto r = client.Call<v1::ListAgentsRequest, v1::ListAgentsResponse>(
      &v1::Query::Stub::ListAgents, v1::ListAgentsRequest());
  if (g.json) return PrintJson(r), 0;
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

int RunTop(Client& client, const GlobalOptions& g, const FilterOptions& f, bool by_total) {
  v1::TopRequest request;
  *request.mutable_filter() = BuildFilter(f);
  request.set_limit(f.limit);
  request.set_sort(by_total ? v1::TopRequest::TOTAL : v1::TopRequest::SELF);
  auto r = client.Call<v1::TopRequest, v1::TopResponse>(&v1::Query::Stub::Top, request);
  if (g.json) return PrintJson(r), 0;
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

int RunHotPaths(Client& client, const GlobalOptions& g, const FilterOptions& f) {
  v1::HotPathsRequest request;
  *request.mutable_filter() = BuildFilter(f);
  request.set_limit(f.limit);
  auto r = client.Call<v1::HotPathsRequest, v1::HotPathsResponse>(&v1::Query::Stub::HotPaths,
                                                                  request);
  if (g.json) return PrintJson(r), 0;
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

int Main(int argc, char** argv) {
  CLI::App app{"strata: query the Strata continuous profiler"};
  app.require_subcommand(1);
  GlobalOptions g;
  const char* env_server = std::getenv("STRATA_SERVER");
  g.server = env_server && *env_server ? env_server : "127.0.0.1:7070";
  app.add_option("--server", g.server, "strata-server address (env STRATA_SERVER)")
      ->capture_default_str();
  app.add_flag("--json", g.json, "print JSON instead of tables");
  app.add_option("--timeout", g.timeout_s, "seconds to wait for the server")
      ->capture_default_str();

  auto* services = app.add_subcommand("services", "list services with samples");
  auto* agents = app.add_subcommand("agents", "list agents known to the server");
  FilterOptions top_filter, paths_filter;
  std::string sort = "self";
  auto* top = app.add_subcommand("top", "functions by self or total samples");
  AddFilterFlags(top, &top_filter);
  top->add_option("--sort", sort, "self or total")
      ->check(CLI::IsMember({"self", "total"}))
      ->capture_default_str();
  auto* hot_paths = app.add_subcommand("hot-paths", "hottest full call paths");
  AddFilterFlags(hot_paths, &paths_filter);
  for (auto* cmd : {services, agents, top, hot_paths}) cmd->fallthrough();

  CLI11_PARSE(app, argc, argv);
  Client client(g);
  if (services->parsed()) return RunServices(client, g);
  if (agents->parsed()) return RunAgents(client, g);
  if (top->parsed()) return RunTop(client, g, top_filter, sort == "total");
  if (hot_paths->parsed()) return RunHotPaths(client, g, paths_filter);
  return 2;
}

}  // namespace
}  // namespace strata::cli

int main(int argc, char** argv) { return strata::cli::Main(argc, argv); }
