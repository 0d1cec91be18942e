// strata-loadgen: simulates a fleet of agents against a real strata-server and checks that
// the server's totals equal what the fleet delivered, per service. Exits 1 if anything was
// lost, counted twice, refused for good or left unacknowledged; prints the figures operators
// size a server with (throughput, ack latency, query latency during the load, and the
// server's CPU, memory and threads when --server-pid is given).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "agent/core/shipper.h"
#include "common/rpc/client_security.h"
#include "common/base/config_file.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "strata/v1/query.grpc.pb.h"
#include "tools/loadgen/fleet.h"
#include "tools/loadgen/otlp_fleet.h"
#include "tools/loadgen/program.h"

namespace {

using strata::loadgen::FleetOptions;
using strata::loadgen::FleetReport;

// CPU seconds (all threads), resident MiB and threads of a process; zeros if unreadable.
struct ProcessSample {
  double cpu_s = 0;
  double rss_mib = 0;
  int threads = 0;
};

ProcessSample SampleProcess(int pid) {
  ProcessSample out;
  if (pid <= 0) return out;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (std::getline(stat, line)) {
    // Fields after the command name (which may hold spaces): state is field 3.
    const size_t close = line.rfind(')');
    std::vector<std::string> f = absl::StrSplit(line.substr(close + 2), ' ');
    uint64_t utime = 0, stime = 0;
    if (f.size() > 12 && absl::SimpleAtoi(f[11], &utime) && absl::SimpleAtoi(f[12], &stime)) {
      out.cpu_s = static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
    }
  }
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  while (std::getline(status, line)) {
    uint64_t v = 0;
    if (line.rfind("VmRSS:", 0) == 0 && absl::SimpleAtoi(absl::StripAsciiWhitespace(
                                                         absl::StripSuffix(line.substr(6), "kB")),
                                                     &v)) {
      out.rss_mib = v / 1024.0;
    } else if (line.rfind("Threads:", 0) == 0) {
      (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)), &out.threads);
    }
  }
  return out;
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()));
  return sorted[i];
}

// Fresh connections, one at a time, each on a channel of its own (no shared subchannel): the
// time from creating it to READY is what an agent's reconnect costs before its first message.
int ProbeConnects(const std::string& server, const strata::rpc::ClientSecurity& security,
                  uint32_t probes) {
  std::vector<double> ms;
  for (uint32_t i = 0; i < probes; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("strata.loadgen.probe", static_cast<int>(i));
    const absl::Time t0 = absl::Now();
    auto channel = security.CreateChannel(server, args);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
      std::fprintf(stderr, "strata-loadgen: connection %u to %s not ready in 10 s\n", i,
                   server.c_str());
      return 1;
    }
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  std::sort(ms.begin(), ms.end());
  std::printf("{\"connects\": %u, \"tls\": %s, \"connect_p50_ms\": %.3f, "
              "\"connect_p99_ms\": %.3f}\n",
              probes, security.tls() ? "true" : "false", Percentile(ms, 0.5),
              Percentile(ms, 0.99));
  return 0;
}

// Everything the command line sets.
struct LoadgenFlags {
  FleetOptions fleet;
  std::string servers;  // comma-separated, into fleet.servers
  strata::loadgen::ProgramOptions program;
  double interval_s = 10, duration_s = 60, ramp_s = 10, backoff_s = 30, drain_s = 60;
  double rate = 99 * 4, query_every_s = 2;
  uint32_t programs = 8;
  int server_pid = 0;
  bool json = false;
  std::vector<double> storms_s;
  strata::rpc::ClientSecurityOptions security;
  std::string query_token_file;
  uint32_t connect_probes = 0;
  std::string stream_file;
  std::vector<std::string> labels;  // --label, into fleet.labels
  std::string protocol = "strata";
};

void AddFlags(CLI::App& app, LoadgenFlags& f) {
  f.fleet.prefix = absl::StrCat("lg", std::random_device{}() % 100000);
  f.fleet.services = 0;
  app.add_option("--server", f.servers,
                 "strata-server address (host:port), or a cluster's nodes separated by commas: "
                 "agent i starts on the (i mod n)-th, moves to the next when its stream ends "
                 "and follows Redirects; queries, totals and --connect-probes use the first")
      ->required();
  app.add_option("--agents", f.fleet.agents, "simulated agents")->capture_default_str();
  app.add_option("--protocol", f.protocol,
                 "what the agents speak: strata (the ingest stream) or otlp (OTLP profiles "
                 "exports, one request per interval, to the same listener)")
      ->capture_default_str()
      ->check(CLI::IsMember({"strata", "otlp"}));
  app.add_option("--interval", f.interval_s, "seconds between an agent's batches")
      ->capture_default_str();
  app.add_option("--rate", f.rate, "samples per second per agent (99 Hz x 4 busy threads)")
      ->capture_default_str();
  app.add_option("--contexts", f.program.contexts, "distinct contexts per batch, at most")
      ->capture_default_str();
  app.add_option("--functions", f.program.functions, "functions per program")
      ->capture_default_str();
  app.add_option("--services", f.fleet.services, "services the agents are spread over (0: N/10)")
      ->capture_default_str();
  app.add_option("--programs", f.programs, "distinct programs (call graphs) the agents run")
      ->capture_default_str();
  app.add_option("--intervals", f.program.intervals,
                 "distinct batches of each program (independent draws of its samples); agent i "
                 "sends batch (sequence + i) mod N, so agents whose indices differ by at least "
                 "their batch count within N send disjoint ones")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--duration", f.duration_s, "seconds of sending")->capture_default_str();
  app.add_option("--ramp-up", f.ramp_s, "seconds over which agents start")->capture_default_str();
  app.add_option("--reconnect-storm-at", f.storms_s,
                 "seconds after the start at which every agent drops and reconnects (repeatable)");
  app.add_option("--max-backoff", f.backoff_s, "longest reconnect backoff, seconds")
      ->capture_default_str();
  app.add_option("--drain-timeout", f.drain_s, "seconds to wait for the last acknowledgements")
      ->capture_default_str();
  app.add_option("--service-prefix", f.fleet.prefix, "prefix of agent, host and service names")
      ->capture_default_str();
  app.add_option("--label", f.labels,
                 "KEY=VALUE fleet label of every agent (repeatable); KEY=V1|V2|... deals the "
                 "values to each service's agents in turn (e.g. version=a|b: two releases side "
                 "by side)");
  strata::rpc::AddClientSecurityFlags(&app, &f.security);
  app.add_option("--query-token-file", f.query_token_file,
                 "token (role reader) for the queries, when --token-file is an agent token");
  app.add_option("--server-pid", f.server_pid, "report this process's CPU, RSS and threads");
  app.add_option("--query-every", f.query_every_s,
                 "seconds between hot-paths queries of one service during the run (0: none)")
      ->capture_default_str();
  app.add_option("--seed", f.fleet.seed, "random seed")->capture_default_str();
  app.add_option("--requests", f.fleet.requests_per_batch,
                 "requests each batch reports for its service, as an agent's "
                 "--requests-metric would (Strata protocol; 0: none)")
      ->capture_default_str();
  app.add_option("--agents-per-connection", f.fleet.agents_per_connection,
                 "simulated agents sharing one HTTP/2 connection")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", f.json, "print the figures as one JSON object");
  app.add_option("--connect-probes", f.connect_probes,
                 "instead of a fleet: open this many fresh connections one after another (TCP, "
                 "and TLS with --tls-ca) and print how long each took to be ready");
  app.add_option("--stream", f.stream_file,
                 "a recorded sample stream (record_stream's text format) as every agent's "
                 "program, instead of synthetic ones");
  strata::base::AddConfigFile(app);
}

// The programs the agents run: synthetic ones, or the one recorded stream (kept in `recorded`).
absl::StatusOr<std::vector<std::unique_ptr<strata::loadgen::Program>>> BuildPrograms(
    LoadgenFlags& f, strata::loadgen::SampleStream* recorded) {
  if (!f.stream_file.empty()) {
    std::ifstream in(f.stream_file);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return absl::NotFoundError(absl::StrCat("--stream ", f.stream_file, ": cannot read"));
    auto parsed = strata::loadgen::ParseSampleStream(text.str());
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stream ", f.stream_file, ": ", parsed.status().ToString()));
    }
    *recorded = *std::move(parsed);
    f.program.recorded = recorded;
    f.programs = 1;
  }
  std::vector<std::unique_ptr<strata::loadgen::Program>> built;
  for (uint32_t i = 0; i < f.programs; ++i) {
    f.program.seed = static_cast<uint32_t>(f.fleet.seed * 1000 + i + 1);
    auto p = strata::loadgen::Program::Build(f.program);
    if (!p.ok()) {
      return absl::Status(p.status().code(),
                          absl::StrCat("building a program: ", p.status().ToString()));
    }
    built.push_back(*std::move(p));
  }
  return built;
}

// Queries during the load, of one service over the last hour, timed: hot paths, top functions
// and a flame graph (SVG), the queries people run while a fleet ships. Also tracks the server's
// peak RSS. Runs on its own thread from construction until Stop().
class QueriesDuringLoad {
 public:
  QueriesDuringLoad(strata::v1::Query::Stub* query, const strata::rpc::ClientSecurity* security,
                    std::string service, const LoadgenFlags& f)
      : query_(query), security_(security), service_(std::move(service)), flags_(f) {
    thread_ = std::thread([this] { Loop(); });
  }
  void Stop() {
    done_.Notify();
    thread_.join();
    for (auto* v : {&hot_paths_ms, &top_ms, &flame_ms}) std::sort(v->begin(), v->end());
  }

  // Sorted once stopped.
  std::vector<double> hot_paths_ms, top_ms, flame_ms;
  double peak_rss = 0;

 private:
  void Loop() {
    absl::Time next_query = absl::Now() + absl::Seconds(flags_.ramp_s + flags_.interval_s);
    while (!done_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      peak_rss = std::max(peak_rss, SampleProcess(flags_.server_pid).rss_mib);
      if (flags_.query_every_s <= 0 || absl::Now() < next_query) continue;
      next_query = absl::Now() + absl::Seconds(flags_.query_every_s);
      strata::v1::ProfileFilter filter;
      filter.set_service(service_);
      filter.mutable_range()->set_from_ms(absl::ToUnixMillis(absl::Now()) - 3600 * 1000);
      strata::v1::HotPathsRequest hot_paths;
      *hot_paths.mutable_filter() = filter;
      Timed<strata::v1::HotPathsResponse>(&strata::v1::Query::Stub::HotPaths, hot_paths,
                                          &hot_paths_ms);
      strata::v1::TopRequest top;
      *top.mutable_filter() = filter;
      Timed<strata::v1::TopResponse>(&strata::v1::Query::Stub::Top, top, &top_ms);
      strata::v1::FlameGraphRequest flame;
      *flame.mutable_filter() = filter;
      flame.set_format(strata::v1::FlameGraphRequest::SVG);
      Timed<strata::v1::FlameGraphResponse>(&strata::v1::Query::Stub::FlameGraph, flame,
                                            &flame_ms);
    }
  }

  template <typename Response, typename Request, typename Method>
  void Timed(Method method, const Request& request, std::vector<double>* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    security_->Authorize(&ctx);
    Response response;
    const absl::Time t0 = absl::Now();
    if ((query_->*method)(&ctx, request, &response).ok()) {
      out->push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
  }

  strata::v1::Query::Stub* query_;
  const strata::rpc::ClientSecurity* security_;
  const std::string service_;
  const LoadgenFlags& flags_;
  absl::Notification done_;
  std::thread thread_;
};

// The server's totals per service of this fleet (prefix), against what the fleet delivered.
struct TotalsCheck {
  uint64_t server_total = 0, lost = 0, extra = 0;
  bool exact() const { return lost == 0 && extra == 0; }
};

absl::StatusOr<TotalsCheck> CheckTotals(strata::v1::Query::Stub* query,
                                        const strata::rpc::ClientSecurity& security,
                                        const std::string& prefix, const FleetReport& r) {
  grpc::ClientContext ctx;
  security.Authorize(&ctx);
  strata::v1::ListServicesRequest req;
  strata::v1::ListServicesResponse resp;
  grpc::Status st = query->ListServices(&ctx, req, &resp);
  if (!st.ok()) return absl::UnavailableError(absl::StrCat("ListServices: ", st.error_message()));
  std::map<std::string, uint64_t> server_totals;
  for (const auto& s : resp.services()) {
    if (s.name().rfind(prefix + "-svc-", 0) == 0) server_totals[s.name()] = s.total_samples();
  }
  TotalsCheck check;
  for (const auto& [service, sent] : r.samples_by_service) {
    const uint64_t got = server_totals.count(service) ? server_totals[service] : 0;
    check.server_total += got;
    if (got < sent) check.lost += sent - got;
    if (got > sent) check.extra += got - sent;
  }
  return check;
}

struct RunFigures {
  const FleetReport& fleet;
  const TotalsCheck& totals;
  const QueriesDuringLoad& queries;
  ProcessSample before, after;
  double span_s = 0;
  std::string first_service;
};

double BytesPerSample(const FleetReport& r) {
  return r.samples_delivered ? static_cast<double>(r.bytes_sent) / r.samples_delivered : 0.0;
}

void PrintJsonReport(const LoadgenFlags& f, const RunFigures& x, bool ok) {
  const FleetReport& r = x.fleet;
  const double seconds = absl::ToDoubleSeconds(f.fleet.duration);
  const double cpu_s = x.after.cpu_s - x.before.cpu_s;
  std::printf(
      "{\"agents\":%u,\"duration_s\":%.1f,\"batches\":%lu,\"samples\":%lu,\"server_samples\":%lu,"
      "\"lost\":%lu,\"extra\":%lu,\"rejected\":%lu,\"unacknowledged\":%lu,\"samples_per_s\":%.0f,"
      "\"contexts_per_s\":%.0f,\"batches_per_s\":%.1f,\"ack_p50_ms\":%.1f,\"ack_p99_ms\":%.1f,"
      "\"ack_max_ms\":%.1f,\"connects\":%lu,\"reconnects\":%lu,\"redirects\":%lu,"
      "\"refusals\":%lu,"
      "\"hot_paths_p50_ms\":%.1f,\"hot_paths_p99_ms\":%.1f,\"top_p99_ms\":%.1f,"
      "\"flamegraph_p99_ms\":%.1f,\"server_cpu_pct\":%.1f,"
      "\"server_cpu_ms_per_million_samples\":%.1f,\"server_rss_mib\":%.1f,"
      "\"server_peak_rss_mib\":%.1f,\"server_threads\":%d,\"protocol\":\"%s\","
      "\"bytes_sent\":%lu,\"bytes_per_sample\":%.2f,\"ok\":%s}\n",
      f.fleet.agents, seconds, r.batches_delivered, r.samples_delivered, x.totals.server_total,
      x.totals.lost, x.totals.extra, r.batches_rejected, r.batches_unacknowledged,
      r.samples_delivered / seconds, r.contexts_delivered / seconds,
      r.batches_delivered / seconds, Percentile(r.ack_latency_ms, 0.5),
      Percentile(r.ack_latency_ms, 0.99),
      r.ack_latency_ms.empty() ? 0.0 : r.ack_latency_ms.back(), r.connects, r.reconnects,
      r.redirects, r.refusals, Percentile(x.queries.hot_paths_ms, 0.5),
      Percentile(x.queries.hot_paths_ms, 0.99),
      Percentile(x.queries.top_ms, 0.99), Percentile(x.queries.flame_ms, 0.99),
      100 * cpu_s / x.span_s, r.samples_delivered ? 1e9 * cpu_s / r.samples_delivered : 0.0,
      x.after.rss_mib, std::max(x.queries.peak_rss, x.after.rss_mib), x.after.threads,
      f.protocol.c_str(), r.bytes_sent, BytesPerSample(r), ok ? "true" : "false");
}

void PrintTextReport(const LoadgenFlags& f, const RunFigures& x) {
  const FleetReport& r = x.fleet;
  const double seconds = absl::ToDoubleSeconds(f.fleet.duration);
  const double cpu_s = x.after.cpu_s - x.before.cpu_s;
  std::printf("strata-loadgen: %u agents, %u services, %.0f s of sending (+%.0f s ramp-up "
              "within), %.1f s in all\n",
              f.fleet.agents, f.fleet.services, seconds, f.ramp_s, x.span_s);
  std::printf("  delivered   %lu batches, %lu samples, %lu contexts (%.1f batches/s, %.0f "
              "samples/s, %.0f contexts/s)\n",
              r.batches_delivered, r.samples_delivered, r.contexts_delivered,
              r.batches_delivered / seconds, r.samples_delivered / seconds,
              r.contexts_delivered / seconds);
  std::printf("  server has  %lu samples of these services: %s (lost %lu, counted twice %lu)\n",
              x.totals.server_total, x.totals.exact() ? "exact" : "MISMATCH", x.totals.lost,
              x.totals.extra);
  std::printf("  sent        %lu bytes of %s messages, %.2f bytes per sample\n", r.bytes_sent,
              f.protocol.c_str(), BytesPerSample(r));
  std::printf("  ack latency p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
              Percentile(r.ack_latency_ms, 0.5), Percentile(r.ack_latency_ms, 0.99),
              r.ack_latency_ms.empty() ? 0.0 : r.ack_latency_ms.back());
  std::printf("  streams     %lu connects, %lu reconnects, %lu redirects, %lu RESOURCE_EXHAUSTED, "
              "%lu batches rejected, %lu unacknowledged\n",
              r.connects, r.reconnects, r.redirects, r.refusals, r.batches_rejected,
              r.batches_unacknowledged);
  const QueriesDuringLoad& q = x.queries;
  if (!q.hot_paths_ms.empty()) {
    std::printf("  queries of %s (last hour) during the load, p50 / p99: hot-paths %.1f / %.1f "
                "ms, top %.1f / %.1f ms, flame graph %.1f / %.1f ms (%zu rounds)\n",
                x.first_service.c_str(), Percentile(q.hot_paths_ms, 0.5),
                Percentile(q.hot_paths_ms, 0.99), Percentile(q.top_ms, 0.5),
                Percentile(q.top_ms, 0.99), Percentile(q.flame_ms, 0.5),
                Percentile(q.flame_ms, 0.99), q.hot_paths_ms.size());
  }
  if (f.server_pid > 0) {
    std::printf("  server      %.1f %% of one core, %.0f CPU ms per million samples, RSS %.0f "
                "MiB (peak %.0f), %d threads (%d before)\n",
                100 * cpu_s / x.span_s,
                r.samples_delivered ? 1e9 * cpu_s / r.samples_delivered : 0.0, x.after.rss_mib,
                std::max(q.peak_rss, x.after.rss_mib), x.after.threads, x.before.threads);
  }
}

int Run(int argc, char** argv) {
  CLI::App app{"strata-loadgen: simulated agents against a strata-server, totals checked"};
  LoadgenFlags f;
  AddFlags(app, f);
  CLI11_PARSE(app, argc, argv);
  FleetOptions& fleet = f.fleet;
  if (fleet.agents == 0 || f.interval_s <= 0 || f.duration_s <= 0 || f.rate <= 0 ||
      f.programs == 0) {
    std::fprintf(stderr, "strata-loadgen: agents, interval, duration, rate, programs must be > 0\n");
    return 2;
  }
  if (fleet.services == 0) fleet.services = std::max<uint32_t>(1, fleet.agents / 10);
  auto servers = strata::agent::ParseServerList(f.servers);
  if (!servers.ok()) {
    std::fprintf(stderr, "strata-loadgen: --server: %s\n",
                 std::string(servers.status().message()).c_str());
    return 2;
  }
  fleet.servers = *std::move(servers);
  for (const std::string& label : f.labels) {
    const size_t eq = label.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == label.size()) {
      std::fprintf(stderr, "strata-loadgen: --label '%s' is not KEY=VALUE[|VALUE...]\n",
                   label.c_str());
      return 2;
    }
    fleet.labels[label.substr(0, eq)] = absl::StrSplit(label.substr(eq + 1), '|');
  }
  auto agent_security = strata::rpc::ClientSecurity::Load(f.security);
  if (!f.query_token_file.empty()) f.security.token_file = f.query_token_file;
  auto query_security = strata::rpc::ClientSecurity::Load(f.security);
  for (const auto* s : {&agent_security, &query_security}) {
    if (!s->ok()) {
      std::fprintf(stderr, "strata-loadgen: %s\n", std::string(s->status().message()).c_str());
      return 2;
    }
  }
  fleet.security = *agent_security;
  if (f.connect_probes > 0) {
    return ProbeConnects(fleet.servers[0], *agent_security, f.connect_probes);
  }
  // A connection per few agents: take every file descriptor the kernel allows.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  fleet.interval = absl::Seconds(f.interval_s);
  fleet.duration = absl::Seconds(f.duration_s);
  fleet.ramp_up = absl::Seconds(f.ramp_s);
  fleet.max_backoff = absl::Seconds(f.backoff_s);
  fleet.drain_timeout = absl::Seconds(f.drain_s);
  for (double s : f.storms_s) fleet.storms.push_back(absl::Seconds(s));
  f.program.samples_per_interval = static_cast<uint32_t>(f.rate * f.interval_s);
  f.program.otlp = f.protocol == "otlp";

  strata::loadgen::SampleStream recorded;
  auto built = BuildPrograms(f, &recorded);
  if (!built.ok()) {
    std::fprintf(stderr, "strata-loadgen: %s\n", std::string(built.status().message()).c_str());
    return built.status().code() == absl::StatusCode::kInvalidArgument ||
                   built.status().code() == absl::StatusCode::kNotFound
               ? 2
               : 1;
  }
  if (!f.json) {
    const auto& first = (*built)[0];
    std::printf("strata-loadgen: %u programs, e.g. %u graph nodes and %lu edges, %u contexts "
                "and %lu samples per batch\n",
                f.programs, first->num_nodes(), static_cast<unsigned long>(first->epoch()),
                first->payload(0).contexts, static_cast<unsigned long>(first->payload(0).samples));
  }
  auto query = strata::v1::Query::NewStub(query_security->CreateChannel(fleet.servers[0]));
  const std::string first_service = absl::StrCat(fleet.prefix, "-svc-0");
  QueriesDuringLoad queries(query.get(), &*query_security, first_service, f);

  const ProcessSample before = SampleProcess(f.server_pid);
  const absl::Time t0 = absl::Now();
  FleetReport r = f.program.otlp ? strata::loadgen::RunOtlpFleet(fleet, *built)
                                 : strata::loadgen::RunFleet(fleet, *built);
  const absl::Duration elapsed = absl::Now() - t0;
  const ProcessSample after = SampleProcess(f.server_pid);
  queries.Stop();

  auto totals = CheckTotals(query.get(), *query_security, fleet.prefix, r);
  if (!totals.ok()) {
    std::fprintf(stderr, "strata-loadgen: %s\n", std::string(totals.status().message()).c_str());
    return 1;
  }
  const bool ok = totals->exact() && r.batches_rejected == 0 && r.batches_unacknowledged == 0;
  const RunFigures figures{r, *totals, queries, before, after, absl::ToDoubleSeconds(elapsed),
                           first_service};
  if (f.json) {
    PrintJsonReport(f, figures, ok);
  } else {
    PrintTextReport(f, figures);
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
