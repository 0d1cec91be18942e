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
#include <sstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "common/rpc/client_security.h"
#include "common/base/config_file.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "strata/v1/query.grpc.pb.h"
#include "tools/loadgen/fleet.h"
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

int Run(int argc, char** argv) {
  CLI::App app{"strata-loadgen: simulated agents against a strata-server, totals checked"};
  FleetOptions fleet;
  strata::loadgen::ProgramOptions program;
  double interval_s = 10, duration_s = 60, ramp_s = 10, backoff_s = 30, drain_s = 60;
  double rate = 99 * 4, query_every_s = 2;
  uint32_t programs = 8;
  int server_pid = 0;
  bool json = false;
  std::vector<double> storms_s;
  fleet.prefix = absl::StrCat("lg", std::random_device{}() % 100000);
  fleet.services = 0;
  app.add_option("--server", fleet.server, "strata-server address (host:port)")->required();
  app.add_option("--agents", fleet.agents, "simulated agents")->capture_default_str();
  app.add_option("--interval", interval_s, "seconds between an agent's batches")
      ->capture_default_str();
  app.add_option("--rate", rate, "samples per second per agent (99 Hz x 4 busy threads)")
      ->capture_default_str();
  app.add_option("--contexts", program.contexts, "distinct contexts per batch, at most")
      ->capture_default_str();
  app.add_option("--functions", program.functions, "functions per program")
      ->capture_default_str();
  app.add_option("--services", fleet.services, "services the agents are spread over (0: N/10)")
      ->capture_default_str();
  app.add_option("--programs", programs, "distinct programs (call graphs) the agents run")
      ->capture_default_str();
  app.add_option("--duration", duration_s, "seconds of sending")->capture_default_str();
  app.add_option("--ramp-up", ramp_s, "seconds over which agents start")->capture_default_str();
  app.add_option("--reconnect-storm-at", storms_s,
                 "seconds after the start at which every agent drops and reconnects (repeatable)");
  app.add_option("--max-backoff", backoff_s, "longest reconnect backoff, seconds")
      ->capture_default_str();
  app.add_option("--drain-timeout", drain_s, "seconds to wait for the last acknowledgements")
      ->capture_default_str();
  app.add_option("--service-prefix", fleet.prefix, "prefix of agent, host and service names")
      ->capture_default_str();
  strata::rpc::ClientSecurityOptions security;
  std::string query_token_file;
  strata::rpc::AddClientSecurityFlags(&app, &security);
  app.add_option("--query-token-file", query_token_file,
                 "token (role reader) for the queries, when --token-file is an agent token");
  app.add_option("--server-pid", server_pid, "report this process's CPU, RSS and threads");
  app.add_option("--query-every", query_every_s,
                 "seconds between hot-paths queries of one service during the run (0: none)")
      ->capture_default_str();
  app.add_option("--seed", fleet.seed, "random seed")->capture_default_str();
  app.add_option("--agents-per-connection", fleet.agents_per_connection,
                 "simulated agents sharing one HTTP/2 connection")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "print the figures as one JSON object");
  uint32_t connect_probes = 0;
  app.add_option("--connect-probes", connect_probes,
                 "instead of a fleet: open this many fresh connections one after another (TCP, "
                 "and TLS with --tls-ca) and print how long each took to be ready");
  std::string stream_file;
  app.add_option("--stream", stream_file,
                 "a recorded sample stream (record_stream's text format) as every agent's "
                 "program, instead of synthetic ones");
  strata::base::AddConfigFile(app);
  CLI11_PARSE(app, argc, argv);
  if (fleet.agents == 0 || interval_s <= 0 || duration_s <= 0 || rate <= 0 || programs == 0) {
    std::fprintf(stderr, "strata-loadgen: agents, interval, duration, rate, programs must be > 0\n");
    return 2;
  }
  if (fleet.services == 0) fleet.services = std::max<uint32_t>(1, fleet.agents / 10);
  auto agent_security = strata::rpc::ClientSecurity::Load(security);
  if (!query_token_file.empty()) security.token_file = query_token_file;
  auto query_security = strata::rpc::ClientSecurity::Load(security);
  for (const auto* s : {&agent_security, &query_security}) {
    if (!s->ok()) {
      std::fprintf(stderr, "strata-loadgen: %s\n", std::string(s->status().message()).c_str());
      return 2;
    }
  }
  fleet.security = *agent_security;
  if (connect_probes > 0) return ProbeConnects(fleet.server, *agent_security, connect_probes);
  // A connection per few agents: take every file descriptor the kernel allows.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  fleet.interval = absl::Seconds(interval_s);
  fleet.duration = absl::Seconds(duration_s);
  fleet.ramp_up = absl::Seconds(ramp_s);
  fleet.max_backoff = absl::Seconds(backoff_s);
  fleet.drain_timeout = absl::Seconds(drain_s);
  for (double s : storms_s) fleet.storms.push_back(absl::Seconds(s));
  program.samples_per_interval = static_cast<uint32_t>(rate * interval_s);

  strata::loadgen::SampleStream recorded;
  if (!stream_file.empty()) {
    std::ifstream in(stream_file);
    std::stringstream text;
    text << in.rdbuf();
    auto parsed = strata::loadgen::ParseSampleStream(text.str());
    if (!in || !parsed.ok()) {
      std::fprintf(stderr, "strata-loadgen: --stream %s: %s\n", stream_file.c_str(),
                   in ? parsed.status().ToString().c_str() : "cannot read");
      return 2;
    }
    recorded = *std::move(parsed);
    program.recorded = &recorded;
    programs = 1;
  }
  std::vector<std::unique_ptr<strata::loadgen::Program>> built;
  for (uint32_t i = 0; i < programs; ++i) {
    program.seed = static_cast<uint32_t>(fleet.seed * 1000 + i + 1);
    auto p = strata::loadgen::Program::Build(program);
    if (!p.ok()) {
      std::fprintf(stderr, "strata-loadgen: building a program: %s\n", p.status().ToString().c_str());
      return 1;
    }
    built.push_back(*std::move(p));
  }

  if (!json) {
    std::printf("strata-loadgen: %u programs, e.g. %u graph nodes and %lu edges, %u contexts "
                "and %lu samples per batch\n",
                programs, built[0]->num_nodes(), static_cast<unsigned long>(built[0]->epoch()),
                built[0]->payload(0).contexts,
                static_cast<unsigned long>(built[0]->payload(0).samples));
  }
  // Queries during the load, of the first service over the last hour, timed: hot paths, top
  // functions and a flame graph (SVG), the queries people run while a fleet ships.
  auto query = strata::v1::Query::NewStub(query_security->CreateChannel(fleet.server));
  const std::string first_service = absl::StrCat(fleet.prefix, "-svc-0");
  absl::Notification done;
  std::vector<double> query_ms, top_ms, flame_ms;
  double peak_rss = 0;
  std::thread watcher([&] {
    absl::Time next_query = absl::Now() + absl::Seconds(ramp_s + interval_s);
    auto timed = [](std::vector<double>* out, auto&& call) {
      const absl::Time t0 = absl::Now();
      if (call().ok()) out->push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    };
    while (!done.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      peak_rss = std::max(peak_rss, SampleProcess(server_pid).rss_mib);
      if (query_every_s <= 0 || absl::Now() < next_query) continue;
      next_query = absl::Now() + absl::Seconds(query_every_s);
      strata::v1::ProfileFilter filter;
      filter.set_service(first_service);
      filter.mutable_range()->set_from_ms(absl::ToUnixMillis(absl::Now()) - 3600 * 1000);
      auto deadline = [] {
        return std::chrono::system_clock::now() + std::chrono::seconds(30);
      };
      timed(&query_ms, [&] {
        grpc::ClientContext ctx;
        ctx.set_deadline(deadline());
        query_security->Authorize(&ctx);
        strata::v1::HotPathsRequest req;
        *req.mutable_filter() = filter;
        strata::v1::HotPathsResponse resp;
        return query->HotPaths(&ctx, req, &resp);
      });
      timed(&top_ms, [&] {
        grpc::ClientContext ctx;
        ctx.set_deadline(deadline());
        query_security->Authorize(&ctx);
        strata::v1::TopRequest req;
        *req.mutable_filter() = filter;
        strata::v1::TopResponse resp;
        return query->Top(&ctx, req, &resp);
      });
      timed(&flame_ms, [&] {
        grpc::ClientContext ctx;
        ctx.set_deadline(deadline());
        query_security->Authorize(&ctx);
        strata::v1::FlameGraphRequest req;
        *req.mutable_filter() = filter;
        req.set_format(strata::v1::FlameGraphRequest::SVG);
        strata::v1::FlameGraphResponse resp;
        return query->FlameGraph(&ctx, req, &resp);
      });
    }
  });

  const ProcessSample before = SampleProcess(server_pid);
  const absl::Time t0 = absl::Now();
  FleetReport r = strata::loadgen::RunFleet(fleet, built);
  const absl::Duration elapsed = absl::Now() - t0;
  const ProcessSample after = SampleProcess(server_pid);
  done.Notify();
  watcher.join();

  // The server's totals, per service, against what the fleet delivered.
  std::map<std::string, uint64_t> server_totals;
  {
    grpc::ClientContext ctx;
    query_security->Authorize(&ctx);
    strata::v1::ListServicesRequest req;
    strata::v1::ListServicesResponse resp;
    grpc::Status st = query->ListServices(&ctx, req, &resp);
    if (!st.ok()) {
      std::fprintf(stderr, "strata-loadgen: ListServices: %s\n", st.error_message().c_str());
      return 1;
    }
    for (const auto& s : resp.services()) {
      if (s.name().rfind(fleet.prefix + "-svc-", 0) == 0) server_totals[s.name()] = s.total_samples();
    }
  }
  uint64_t lost = 0, extra = 0, server_total = 0;
  for (const auto& [service, sent] : r.samples_by_service) {
    const uint64_t got = server_totals.count(service) ? server_totals[service] : 0;
    server_total += got;
    if (got < sent) lost += sent - got;
    if (got > sent) extra += got - sent;
  }
  for (auto* v : {&query_ms, &top_ms, &flame_ms}) std::sort(v->begin(), v->end());
  const double span_s = absl::ToDoubleSeconds(elapsed);
  const double cpu_s = after.cpu_s - before.cpu_s;
  const bool exact = lost == 0 && extra == 0;
  const bool ok = exact && r.batches_rejected == 0 && r.batches_unacknowledged == 0;
  const double samples_per_s = r.samples_delivered / absl::ToDoubleSeconds(fleet.duration);
  if (json) {
    std::printf(
        "{\"agents\":%u,\"duration_s\":%.1f,\"batches\":%lu,\"samples\":%lu,\"server_samples\":%lu,"
        "\"lost\":%lu,\"extra\":%lu,\"rejected\":%lu,\"unacknowledged\":%lu,\"samples_per_s\":%.0f,"
        "\"contexts_per_s\":%.0f,\"batches_per_s\":%.1f,\"ack_p50_ms\":%.1f,\"ack_p99_ms\":%.1f,"
        "\"ack_max_ms\":%.1f,\"connects\":%lu,\"reconnects\":%lu,\"refusals\":%lu,"
        "\"hot_paths_p50_ms\":%.1f,\"hot_paths_p99_ms\":%.1f,\"top_p99_ms\":%.1f,"
        "\"flamegraph_p99_ms\":%.1f,\"server_cpu_pct\":%.1f,"
        "\"server_cpu_ms_per_million_samples\":%.1f,\"server_rss_mib\":%.1f,"
        "\"server_peak_rss_mib\":%.1f,\"server_threads\":%d,\"ok\":%s}\n",
        fleet.agents, absl::ToDoubleSeconds(fleet.duration), r.batches_delivered, r.samples_delivered,
        server_total, lost, extra, r.batches_rejected, r.batches_unacknowledged, samples_per_s,
        r.contexts_delivered / absl::ToDoubleSeconds(fleet.duration),
        r.batches_delivered / absl::ToDoubleSeconds(fleet.duration),
        Percentile(r.ack_latency_ms, 0.5), Percentile(r.ack_latency_ms, 0.99),
        r.ack_latency_ms.empty() ? 0.0 : r.ack_latency_ms.back(), r.connects, r.reconnects,
        r.refusals, Percentile(query_ms, 0.5), Percentile(query_ms, 0.99),
        Percentile(top_ms, 0.99), Percentile(flame_ms, 0.99), 100 * cpu_s / span_s, r.samples_delivered ? 1e9 * cpu_s / r.samples_delivered : 0.0,
        after.rss_mib, std::max(peak_rss, after.rss_mib), after.threads, ok ? "true" : "false");
  } else {
    std::printf("strata-loadgen: %u agents, %u services, %.0f s of sending (+%.0f s ramp-up "
                "within), %.1f s in all\n",
                fleet.agents, fleet.services, absl::ToDoubleSeconds(fleet.duration), ramp_s, span_s);
    std::printf("  delivered   %lu batches, %lu samples, %lu contexts (%.1f batches/s, %.0f "
                "samples/s, %.0f contexts/s)\n",
                r.batches_delivered, r.samples_delivered, r.contexts_delivered,
                r.batches_delivered / absl::ToDoubleSeconds(fleet.duration), samples_per_s,
                r.contexts_delivered / absl::ToDoubleSeconds(fleet.duration));
    std::printf("  server has  %lu samples of these services: %s (lost %lu, counted twice %lu)\n",
                server_total, exact ? "exact" : "MISMATCH", lost, extra);
    std::printf("  ack latency p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
                Percentile(r.ack_latency_ms, 0.5), Percentile(r.ack_latency_ms, 0.99),
                r.ack_latency_ms.empty() ? 0.0 : r.ack_latency_ms.back());
    std::printf("  streams     %lu connects, %lu reconnects, %lu RESOURCE_EXHAUSTED, %lu batches "
                "rejected, %lu unacknowledged\n",
                r.connects, r.reconnects, r.refusals, r.batches_rejected,
                r.batches_unacknowledged);
    if (!query_ms.empty()) {
      std::printf("  queries of %s (last hour) during the load, p50 / p99: hot-paths %.1f / %.1f "
                  "ms, top %.1f / %.1f ms, flame graph %.1f / %.1f ms (%zu rounds)\n",
                  first_service.c_str(), Percentile(query_ms, 0.5), Percentile(query_ms, 0.99),
                  Percentile(top_ms, 0.5), Percentile(top_ms, 0.99), Percentile(flame_ms, 0.5),
                  Percentile(flame_ms, 0.99), query_ms.size());
    }
    if (server_pid > 0) {
      std::printf("  server      %.1f %% of one core, %.0f CPU ms per million samples, RSS %.0f "
                  "MiB (peak %.0f), %d threads (%d before)\n",
                  100 * cpu_s / span_s,
                  r.samples_delivered ? 1e9 * cpu_s / r.samples_delivered : 0.0,
                  after.rss_mib, std::max(peak_rss, after.rss_mib), after.threads,
                  before.threads);
    }
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
