// Capture commands: `capture` (run an ad hoc, high-rate capture and print its result),
// `capture show ID`, `capture cancel ID` and `captures` (list stored captures).
//
// `capture` holds one server-streaming Capture.Run call open for the capture's duration and
// draws its progress on stderr (a redrawn bar on a terminal, one line a second otherwise);
// the result goes to stdout (or -o FILE). Ctrl-C cancels the capture on every agent: the
// SIGINT handler only sets a flag, a watcher thread then calls Capture.Cancel and cancels the
// stream, and the command exits with status 130.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "cli/client.h"
#include "cli/format.h"
#include "strata/v1/capture.grpc.pb.h"

namespace strata::cli {

void AddCaptureCommands(CLI::App* app, CliContext* context, int* exit_code);

namespace {

std::atomic<bool> g_interrupted{false};
void OnInterrupt(int) { g_interrupted.store(true); }

struct CaptureOptions {
  std::string service, host;
  uint32_t pid = 0;
  std::string duration = "30s";
  uint32_t frequency = 499;
  std::string format = "hot-paths";
  std::string output;
  uint32_t limit = 20;
};

struct ShowOptions {
  std::string capture_id;
  std::string format = "hot-paths";
  std::string output;
  uint32_t limit = 20;
};

std::string TargetText(const v1::CaptureRecord& r) {
  std::vector<std::string> parts;
  if (!r.service().empty()) parts.push_back(r.service());
  if (!r.host().empty()) parts.push_back(absl::StrCat("host ", r.host()));
  if (r.pid() != 0) parts.push_back(absl::StrCat("pid ", r.pid()));
  return absl::StrJoin(parts, ", ");
}

// Prints the capture's profile like any query result. Returns the exit status.
int PrintResult(CliContext* ctx, const std::string& capture_id, const std::string& title,
                const std::string& format, const std::string& output, uint32_t limit) {
  Client& client = ctx->client();
  v1::ProfileFilter filter;
  filter.set_capture_id(capture_id);
  if (format == "top") {
    v1::TopRequest request;
    *request.mutable_filter() = filter;
    request.set_limit(limit);
    auto r = client.Call(client.query(), &v1::Query::Stub::Top, request);
    if (ctx->options().json) return PrintJson(r), 0;
    std::printf("Top functions of capture %s (%s, %s samples)\n", capture_id.c_str(),
                title.c_str(), WithThousands(r.total_samples()).c_str());
    if (r.total_samples() == 0) return std::printf("No samples.\n"), 0;
    PrintTopTable(r);
    return 0;
  }
  if (format == "hot-paths") {
    v1::HotPathsRequest request;
    *request.mutable_filter() = filter;
    request.set_limit(limit);
    auto r = client.Call(client.query(), &v1::Query::Stub::HotPaths, request);
    if (ctx->options().json) return PrintJson(r), 0;
    std::printf("Hot paths of capture %s (%s, %s samples)\n", capture_id.c_str(), title.c_str(),
                WithThousands(r.total_samples()).c_str());
    if (r.total_samples() == 0) return std::printf("No samples.\n"), 0;
    PrintHotPathsTable(r);
    return 0;
  }
  if (format == "flamegraph") {
    v1::FlameGraphRequest request;
    *request.mutable_filter() = filter;
    request.set_format(ctx->options().json ? v1::FlameGraphRequest::JSON
                                           : v1::FlameGraphRequest::SVG);
    request.set_title(absl::StrCat("capture ", capture_id, " (", title, ")"));
    auto r = client.Call(client.large_query(), &v1::Query::Stub::FlameGraph, request);
    WriteOutput(output, r.rendered());
    if (!output.empty() && output != "-") {
      std::fprintf(stderr, "Wrote flame graph of capture %s (%s samples) to %s\n",
                   capture_id.c_str(), WithThousands(r.total_samples()).c_str(), output.c_str());
    }
    return 0;
  }
  // pprof: binary, never to a terminal by accident.
  if (output.empty() && isatty(STDOUT_FILENO)) Fail("--format pprof needs -o FILE");
  v1::ExportRequest request;
  *request.mutable_filter() = filter;
  request.set_format(v1::ExportRequest::PPROF);
  auto r = client.Call(client.large_query(), &v1::Query::Stub::Export, request);
  WriteOutput(output, r.data());
  if (!output.empty() && output != "-") {
    std::fprintf(stderr, "Wrote pprof profile of capture %s (%s samples) to %s\n",
                 capture_id.c_str(), WithThousands(r.total_samples()).c_str(), output.c_str());
  }
  return 0;
}

std::string RatesText(const v1::CaptureProgress& p) {
  std::vector<std::string> rates;
  for (const auto& a : p.agent()) {
    if (a.reporting()) rates.push_back(absl::StrCat(a.effective_frequency_hz()));
  }
  if (rates.empty()) return absl::StrCat(p.requested_frequency_hz(), " Hz requested");
  std::sort(rates.begin(), rates.end());
  rates.erase(std::unique(rates.begin(), rates.end()), rates.end());
  return absl::StrCat(absl::StrJoin(rates, "/"), " Hz");
}

void DrawProgress(const v1::CaptureProgress& p, bool tty) {
  const double elapsed = std::min<double>(p.elapsed_ms(), p.duration_ms()) / 1000.0;
  const double total = p.duration_ms() / 1000.0;
  const std::string counts =
      absl::StrFormat("%.1f/%.1f s  %s samples  %u/%u agents  %s", elapsed, total,
                      WithThousands(p.samples()), p.agents_reporting(), p.agents(), RatesText(p));
  if (!tty) {
    std::fprintf(stderr, "capture %s: %s\n", p.capture_id().c_str(), counts.c_str());
    return;
  }
  constexpr int kWidth = 30;
  const int filled =
      total > 0 ? static_cast<int>(kWidth * std::min(1.0, elapsed / total)) : kWidth;
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  std::fprintf(stderr, "\r\033[K[%s] %s", bar.c_str(), counts.c_str());
  std::fflush(stderr);
}

int RunCapture(CliContext* ctx, const CaptureOptions& o) {
  if (o.service.empty() && o.host.empty()) Fail("give --service S, or --host H [--pid P]");
  if (o.pid != 0 && o.host.empty() && o.service.empty()) Fail("--pid needs --host");
  auto duration = ParseDuration(o.duration);
  if (!duration.ok() || *duration <= 0) {
    Fail(absl::StrCat("--duration: ", duration.ok() ? "must be positive"
                                                     : std::string(duration.status().message())));
  }
  if (*duration > 3'600'000) Fail("--duration: at most 1h");
  if (o.format == "pprof" && o.output.empty() && isatty(STDOUT_FILENO)) {
    Fail("--format pprof needs -o FILE");
  }

  v1::RunCaptureRequest request;
  request.set_service(o.service);
  request.set_host(o.host);
  request.set_pid(o.pid);
  request.set_duration_ms(static_cast<uint32_t>(*duration));
  request.set_frequency_hz(o.frequency);

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(*duration) +
                       std::chrono::seconds(ctx->options().timeout_s));
  ctx->client().Authorize(&context);
  v1::Capture::Stub* stub = ctx->client().capture();  // created before the watcher shares it

  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  absl::Mutex mu;
  std::string capture_id;  // known after the first progress message
  bool done = false;
  std::atomic<bool> cancelled{false};
  // Signal handlers cannot call into gRPC: this thread turns the flag into a cancellation.
  std::thread watcher([&] {
    absl::MutexLock lock(&mu);
    while (!done) {
      mu.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(50));
      if (done || !g_interrupted.load()) continue;
      cancelled = true;
      if (!capture_id.empty()) {
        grpc::ClientContext cancel_context;
        cancel_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
        ctx->client().Authorize(&cancel_context);
        v1::CancelCaptureRequest cancel;
        cancel.set_capture_id(capture_id);
        v1::CancelCaptureResponse response;
        mu.Unlock();
        (void)stub->Cancel(&cancel_context, cancel, &response);
        mu.Lock();
      }
      // Ends the stream; the server also stops the agents when the call goes away.
      context.TryCancel();
      break;
    }
  });
  auto stop_watcher = [&] {
    {
      absl::MutexLock lock(&mu);
      done = true;
    }
    watcher.join();
  };

  const bool tty = isatty(STDERR_FILENO) && !ctx->options().json;
  auto reader = stub->Run(&context, request);
  v1::CaptureProgress progress, last;
  auto last_line = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  bool drew = false;
  while (reader->Read(&progress)) {
    {
      absl::MutexLock lock(&mu);
      capture_id = progress.capture_id();
    }
    last = progress;
    if (progress.finished()) break;
    const auto now = std::chrono::steady_clock::now();
    if (ctx->options().json) continue;
    if (tty || now - last_line >= std::chrono::seconds(1)) {
      DrawProgress(progress, tty);
      drew = true;
      last_line = now;
    }
  }
  if (last.finished()) {
    // Read to the end so the call's status is the server's.
    while (reader->Read(&progress)) {
    }
  }
  grpc::Status status = reader->Finish();
  stop_watcher();
  if (tty && drew) std::fputs("\n", stderr);

  if (cancelled.load()) {
    if (last.capture_id().empty()) Fail("capture cancelled (Ctrl-C) before it started");
    // The agents' last batches are still on their way: the stored capture counts them.
    std::fprintf(stderr,
                 "strata: capture %s cancelled (Ctrl-C): stopped on every agent; what they "
                 "sampled until then is kept (strata capture show %s)\n",
                 last.capture_id().c_str(), last.capture_id().c_str());
    return 130;
  }
  if (!status.ok() && !last.finished()) {
    ctx->client().Check(status);  // exits with the server's message
  }
  if (!status.ok()) Fail(absl::StrCat("capture ", last.capture_id(), ": ", status.error_message()));
  if (!last.finished()) Fail("the server ended the capture stream without a result");
  if (ctx->options().json && o.format != "flamegraph" && o.format != "pprof") PrintJson(last);
  if (!ctx->options().json) {
    std::fprintf(stderr, "Capture %s: %s samples in %.1f s from %u agent(s) at %s\n",
                 last.capture_id().c_str(), WithThousands(last.samples()).c_str(),
                 last.elapsed_ms() / 1000.0, last.agents(), RatesText(last).c_str());
    for (const auto& a : last.agent()) {
      if (!a.error().empty()) {
        std::fprintf(stderr, "  agent %s (%s): %s\n", a.agent_id().c_str(), a.host().c_str(),
                     a.error().c_str());
      }
    }
  }
  if (!last.error().empty()) {
    std::fprintf(stderr, "strata: capture %s: %s\n", last.capture_id().c_str(),
                 last.error().c_str());
    if (last.samples() == 0) return 1;
  }
  std::string title = o.service.empty() ? absl::StrCat("host ", o.host) : o.service;
  if (o.pid != 0) absl::StrAppend(&title, ", pid ", o.pid);
  // A capture cancelled or failed before its end says how long it ran.
  const std::string ran = last.error().empty()
                              ? o.duration
                              : absl::StrFormat("%.1fs of %s", last.elapsed_ms() / 1000.0,
                                                o.duration);
  absl::StrAppend(&title, ", ", ran, " at ", o.frequency, " Hz");
  const int rc = PrintResult(ctx, last.capture_id(), title, o.format, o.output, o.limit);
  return last.error().empty() ? rc : 1;
}

v1::CaptureRecord GetRecord(CliContext* ctx, const std::string& capture_id) {
  v1::GetCaptureRequest request;
  request.set_capture_id(capture_id);
  return ctx->client().Call(ctx->client().capture(), &v1::Capture::Stub::Get, request);
}

int RunShow(CliContext* ctx, const ShowOptions& o) {
  v1::CaptureRecord r = GetRecord(ctx, o.capture_id);
  if (ctx->options().json && (o.format == "top" || o.format == "hot-paths")) {
    PrintJson(r);
  } else if (!ctx->options().json) {
    std::printf("Capture %s\n", r.capture_id().c_str());
    std::printf("  target:    %s\n", TargetText(r).c_str());
    std::printf("  frequency: %u Hz requested\n", r.frequency_hz());
    std::printf("  started:   %s\n", FormatRfc3339(r.start_ms()).c_str());
    if (r.end_ms() != 0) {
      std::printf("  ended:     %s (%.1f s)\n", FormatRfc3339(r.end_ms()).c_str(),
                  (r.end_ms() - r.start_ms()) / 1000.0);
    }
    std::printf("  state:     %s\n",
                !r.finished() ? "running" : (r.error().empty() ? "finished" : "failed"));
    if (!r.error().empty()) std::printf("  error:     %s\n", r.error().c_str());
    std::printf("\n");
  }
  return PrintResult(ctx, r.capture_id(), TargetText(r), o.format, o.output, o.limit);
}

int RunList(CliContext* ctx) {
  auto r = ctx->client().Call(ctx->client().capture(), &v1::Capture::Stub::List, v1::ListCapturesRequest());
  WarnUnreachable(r.unreachable_nodes());
  if (ctx->options().json) return PrintJson(r), 0;
  if (r.captures().empty()) {
    std::printf("No captures (start one with `strata capture --service S --duration 30s`).\n");
    return 0;
  }
  Table table({"CAPTURE", "TARGET", "HZ", "STARTED", "DURATION", "STATE"}, {2});
  for (const auto& c : r.captures()) {
    const std::string duration =
        c.end_ms() != 0 ? absl::StrFormat("%.1fs", (c.end_ms() - c.start_ms()) / 1000.0) : "-";
    std::string state = !c.finished() ? "running" : (c.error().empty() ? "finished" : "failed");
    if (!c.error().empty()) absl::StrAppend(&state, ": ", c.error());
    table.AddRow({c.capture_id(), TargetText(c), absl::StrCat(c.frequency_hz()),
                  FormatRfc3339(c.start_ms()), duration, state});
  }
  std::fputs(table.ToString().c_str(), stdout);
  return 0;
}

int RunCancel(CliContext* ctx, const std::string& capture_id) {
  v1::CancelCaptureRequest request;
  request.set_capture_id(capture_id);
  auto r = ctx->client().Call(ctx->client().capture(), &v1::Capture::Stub::Cancel, request);
  if (ctx->options().json) return PrintJson(r), 0;
  if (!r.cancelled()) {
    std::fprintf(stderr, "strata: capture %s is not running\n", capture_id.c_str());
    return 1;
  }
  std::printf("Capture %s cancelled.\n", capture_id.c_str());
  return 0;
}

void AddFormatFlags(CLI::App* cmd, std::string* format, std::string* output, uint32_t* limit) {
  cmd->add_option("--format,-f", *format, "result: top, hot-paths, flamegraph (SVG) or pprof")
      ->check(CLI::IsMember({"top", "hot-paths", "flamegraph", "pprof"}))
      ->capture_default_str();
  cmd->add_option("--output,-o", *output, "write the result here (flamegraph, pprof)");
  cmd->add_option("--limit,-n", *limit, "rows to show (top, hot-paths)")->capture_default_str();
}

}  // namespace

void AddCaptureCommands(CLI::App* app, CliContext* ctx, int* exit_code) {
  static CaptureOptions run;
  auto* capture = app->add_subcommand(
      "capture", "profile one service or process now, at a high rate, and print the result");
  capture->add_option("--service,-s", run.service, "service to capture (on every host)");
  capture->add_option("--host", run.host, "only this host (with --pid: one process)");
  capture->add_option("--pid", run.pid, "process ID on --host");
  capture->add_option("--duration,-d", run.duration, "how long (e.g. 5s, 30s, 2m)")
      ->capture_default_str();
  capture->add_option("--frequency,--hz", run.frequency, "samples per second per thread")
      ->check(CLI::Range(1u, 10000u))
      ->capture_default_str();
  AddFormatFlags(capture, &run.format, &run.output, &run.limit);
  capture->require_subcommand(0, 1);

  static ShowOptions show;
  auto* show_cmd = capture->add_subcommand("show", "a stored capture: metadata and result");
  show_cmd->add_option("id", show.capture_id, "capture ID (see `strata captures`)")->required();
  AddFormatFlags(show_cmd, &show.format, &show.output, &show.limit);
  show_cmd->callback([=] { *exit_code = RunShow(ctx, show); });

  static std::string cancel_id;
  auto* cancel_cmd = capture->add_subcommand("cancel", "stop a running capture on every agent");
  cancel_cmd->add_option("id", cancel_id, "capture ID")->required();
  cancel_cmd->callback([=] { *exit_code = RunCancel(ctx, cancel_id); });

  capture->callback([=] {
    if (show_cmd->parsed() || cancel_cmd->parsed()) return;
    *exit_code = RunCapture(ctx, run);
  });

  auto* list = app->add_subcommand("captures", "stored ad hoc captures, newest first");
  list->callback([=] { *exit_code = RunList(ctx); });
}

}  // namespace strata::cli
