// Query commands: services, agents, top, hot-paths, flamegraph, diff, export, quality.
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "common/base/clock.h"
#include "cli/format.h"

namespace strata::cli {
namespace {

std::string ArchSuffix(const google::protobuf::RepeatedPtrField<std::string>& archs) {
  if (archs.empty()) return "";
  return absl::StrCat(", ", absl::StrJoin(archs, "+"));
}

// What an empty answer says: the selection too, when one was given (it may be what is empty).
std::string NoSamplesText(const FilterOptions& f) {
  if (f.select.empty()) return "No samples in this range.\n";
  return absl::StrCat("No samples in this range match --select ", f.select, ".\n");
}

int RunLabels(CliContext* ctx, const std::string& service) {
  Client& client = ctx->client();
  v1::ListLabelsRequest request;
  request.set_service(service);
  auto r = client.Call(client.query(), &v1::Query::Stub::ListLabels, request);
  WarnUnreachable(r.unreachable_nodes());
  if (r.labels().empty()) FailIfUnknownService(client, service);
  if (ctx->options().json) return PrintJson(r), 0;
  if (r.labels().empty()) {
    std::printf("The targets of %s carry no labels.\n", service.c_str());
    return 0;
  }
  Table table({"LABEL", "VALUES"}, {});
  for (const auto& l : r.labels()) table.AddRow({l.key(), absl::StrJoin(l.values(), ",")});
  std::fputs(table.ToString().c_str(), stdout);
  std::printf("%u label sets\n", r.label_sets());
  return 0;
}

int RunServices(CliContext* ctx) {
  Client& client = ctx->client();
  auto r = client.Call(client.query(), &v1::Query::Stub::ListServices, v1::ListServicesRequest());
  WarnUnreachable(r.unreachable_nodes());
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
  WarnUnreachable(r.unreachable_nodes());
  if (ctx->options().json) return PrintJson(r), 0;
  if (r.agents().empty()) {
    std::printf("No agents have connected since the server started.\n");
    return 0;
  }
  Table table({"AGENT", "HOST", "ARCH", "VERSION", "STATE", "BATCHES", "LAST BATCH", "SPOOL",
               "DROPPED", "GRAPH EDGES", "TARGETS"},
              {5, 7, 8, 9});
  for (const auto& a : r.agents()) {
    const v1::AgentHealth& h = a.health();
    // Unacknowledged batches held (in memory only: lost if the agent stops), and what the
    // agent lost: dropped past its spool's bound, or found torn or without their graph.
    const std::string spool = !a.has_health() ? "-"
                              : absl::StrCat(WithThousands(h.spool_batches()),
                                             h.spool_on_disk() ? "" : " (memory)");
    const uint64_t lost =
        h.spool_dropped_batches() + h.spool_corrupt_records() + h.spool_orphaned_batches();
    table.AddRow({a.agent_id(), a.host(), a.arch(), a.version(),
                  a.connected() ? "connected" : "gone", WithThousands(a.batches()),
                  a.last_batch_ms() ? FormatRfc3339(a.last_batch_ms()) : "-", spool,
                  a.has_health() ? WithThousands(lost) : "-",
                  a.has_health() ? WithThousands(h.graph_edges()) : "-",
                  absl::StrJoin(a.targets(), ",")});
  }
  std::fputs(table.ToString().c_str(), stdout);
  return 0;
}

// One header line per phase change in the range: a profile that mixes two phases reads
// differently from one of a steady program.
void PrintPhaseHeader(Client& client, const v1::ProfileFilter& filter) {
  v1::PhasesRequest request;
  *request.mutable_filter() = filter;
  auto r = client.Call(client.query(), &v1::Query::Stub::Phases, request);
  for (const auto& c : r.changes()) {
    auto leaf = [](const v1::PhaseChange::Shift& s) {
      return s.path().frames().empty() ? std::string("?")
                                       : s.path().frames().rbegin()->function();
    };
    std::printf("Phase change at %s: %s rose, %s fell (see strata phases)\n",
                FormatRfc3339(c.detected_ms()).c_str(),
                c.rose().empty() ? "?" : leaf(c.rose(0)).c_str(),
                c.fell().empty() ? "?" : leaf(c.fell(0)).c_str());
  }
}

// "file:line" with the file's last two path components (enough to tell headers apart).
std::string LineText(const v1::Frame& frame) {
  if (frame.file().empty()) return "?";
  std::string_view file = frame.file();
  size_t cut = file.rfind('/');
  if (cut != std::string_view::npos && cut > 0) {
    const size_t before = file.rfind('/', cut - 1);
    if (before != std::string_view::npos) file = file.substr(before + 1);
  }
  return absl::StrCat(std::string(file), ":", frame.line());
}

// A source line's LINE, FUNCTION (marked when inlined) and INLINED INTO cells: its inline
// chain, innermost first (not empty).
void AppendLineCells(const google::protobuf::RepeatedPtrField<v1::Frame>& frames,
                     std::vector<std::string>* row) {
  const v1::Frame& leaf = frames[0];
  std::string into;
  for (int i = 1; i < frames.size(); ++i) {
    absl::StrAppend(&into, i > 1 ? " < " : "", frames[i].function(), " (", LineText(frames[i]),
                    ")");
  }
  row->push_back(LineText(leaf));
  row->push_back(absl::StrCat(FrameText(leaf), leaf.inlined() ? " [inline]" : ""));
  row->push_back(std::move(into));
}

// Self samples per source line: the line, its function (marked when inlined) and the
// functions it was inlined into.
int PrintTopLines(const v1::TopResponse& r, const FilterOptions& f, bool language_self) {
  std::printf("Top lines of %s (%s, %s samples, %s without line information%s)\n",
              f.service.c_str(), RangeText(f).c_str(), WithThousands(r.total_samples()).c_str(),
              WithThousands(r.unresolved_samples()).c_str(),
              language_self ? "; Python and Java lines with the native code they call" : "");
  if (r.total_samples() == 0) {
    std::printf(language_self ? "No samples in this range.\n"
                              : "No leaf addresses in this range.\n");
    return 0;
  }
  Table table({"SELF", "SELF%", "LINE", "FUNCTION", "INLINED INTO"}, {0, 1});
  for (const auto& l : r.lines()) {
    if (l.frames_size() == 0) continue;
    std::vector<std::string> row{WithThousands(l.self()), Percent(l.self(), r.total_samples())};
    AppendLineCells(l.frames(), &row);
    table.AddRow(std::move(row));
  }
  std::fputs(table.ToString().c_str(), stdout);
  return 0;
}

int RunTop(CliContext* ctx, const FilterOptions& f, bool by_total, bool by_line,
           bool language_self) {
  if (language_self && !by_line) Fail("--language-self counts lines: it needs --by line");
  Client& client = ctx->client();
  v1::TopRequest request;
  *request.mutable_filter() = BuildFilter(f);
  request.set_limit(f.limit);
  request.set_sort(by_total ? v1::TopRequest::TOTAL : v1::TopRequest::SELF);
  request.set_by_line(by_line);
  request.set_language_self(language_self);
  auto r = client.Call(client.query(), &v1::Query::Stub::Top, request);
  WarnUnreachable(r.unreachable_nodes());
  if (ctx->options().json) return PrintJson(r), 0;
  if (by_line) return PrintTopLines(r, f, language_self);
  std::printf("Top functions of %s (%s, %s samples%s)\n", f.service.c_str(),
              RangeText(f).c_str(), WithThousands(r.total_samples()).c_str(),
              ArchSuffix(r.archs()).c_str());
  PrintPhaseHeader(client, request.filter());
  if (r.total_samples() == 0) {
    std::fputs(NoSamplesText(f).c_str(), stdout);
    return 0;
  }
  PrintTopTable(r);
  return 0;
}

int RunHotPaths(CliContext* ctx, const FilterOptions& f) {
  Client& client = ctx->client();
  v1::HotPathsRequest request;
  *request.mutable_filter() = BuildFilter(f);
  request.set_limit(f.limit);
  auto r = client.Call(client.query(), &v1::Query::Stub::HotPaths, request);
  WarnUnreachable(r.unreachable_nodes());
  if (ctx->options().json) return PrintJson(r), 0;
  std::printf("Hot paths of %s (%s, %s samples%s)\n", f.service.c_str(), RangeText(f).c_str(),
              WithThousands(r.total_samples()).c_str(), ArchSuffix(r.archs()).c_str());
  if (r.total_samples() == 0) {
    std::fputs(NoSamplesText(f).c_str(), stdout);
    return 0;
  }
  PrintHotPathsTable(r);
  return 0;
}

struct FlameOptions {
  std::string format = "svg";
  std::string output;
  uint32_t max_nodes = 0;
  bool lines = false;
};

int RunFlameGraph(CliContext* ctx, const FilterOptions& f, const FlameOptions& o) {
  Client& client = ctx->client();
  v1::FlameGraphRequest request;
  *request.mutable_filter() = BuildFilter(f);
  request.set_max_nodes(o.max_nodes);
  request.set_lines(o.lines);
  v1::FlameGraphRequest::Format format = v1::FlameGraphRequest::SVG;  // --format is checked
  (void)v1::FlameGraphRequest::Format_Parse(absl::AsciiStrToUpper(o.format), &format);
  const bool to_stdout = o.output.empty() || o.output == "-";
  // --json without a file: the JSON tree is what is printed.
  if (ctx->options().json && to_stdout) format = v1::FlameGraphRequest::JSON;
  request.set_format(format);
  auto r = client.Call(client.large_query(), &v1::Query::Stub::FlameGraph, request);
  WarnUnreachable(r.unreachable_nodes());
  if (to_stdout) {
    std::fwrite(r.rendered().data(), 1, r.rendered().size(), stdout);
    return 0;
  }
  WriteOutput(o.output, r.rendered());
  if (ctx->options().json) {
    r.clear_rendered();
    return PrintJson(r), 0;
  }
  std::printf("Wrote %s flame graph of %s (%s, %s samples%s) to %s (%s bytes)\n",
              o.format.c_str(), f.service.c_str(), RangeText(f).c_str(),
              WithThousands(r.total_samples()).c_str(), ArchSuffix(r.archs()).c_str(),
              o.output.c_str(), WithThousands(r.rendered().size()).c_str());
  if (r.pruned_nodes() > 0) {
    std::printf("%s light nodes left out (raise --max-nodes to keep them)\n",
                WithThousands(r.pruned_nodes()).c_str());
  }
  return 0;
}

struct ExportOptions {
  std::string format = "pprof";
  std::string output;
};

int RunExport(CliContext* ctx, const FilterOptions& f, const ExportOptions& o) {
  Client& client = ctx->client();
  v1::ExportRequest request;
  *request.mutable_filter() = BuildFilter(f);
  const bool llvm = o.format == "llvm-sample", otlp = o.format == "otlp";
  request.set_format(llvm   ? v1::ExportRequest::LLVM_SAMPLE
                     : otlp ? v1::ExportRequest::OTLP
                            : v1::ExportRequest::PPROF);
  auto r = client.Call(client.large_query(), &v1::Query::Stub::Export, request);
  WarnUnreachable(r.unreachable_nodes());
  WriteOutput(o.output, r.data());
  if (ctx->options().json) {
    r.clear_data();
    return PrintJson(r), 0;
  }
  if (llvm) {
    std::printf("Wrote LLVM sample profile of %s (%s, %s samples with lines) to %s; use it with "
                "`llvm-profdata merge --sample %s -o prof.afdo` and `clang "
                "-fprofile-sample-use=prof.afdo`\n",
                f.service.c_str(), RangeText(f).c_str(), WithThousands(r.total_samples()).c_str(),
                o.output.c_str(), o.output.c_str());
    return 0;
  }
  if (otlp) {
    std::printf("Wrote OTLP profiles of %s (%s, %s samples) to %s (%s bytes): a serialized "
                "ExportProfilesServiceRequest (profiles v1development)\n",
                f.service.c_str(), RangeText(f).c_str(), WithThousands(r.total_samples()).c_str(),
                o.output.c_str(), WithThousands(r.data().size()).c_str());
    return 0;
  }
  std::printf("Wrote pprof profile of %s (%s, %s samples) to %s (%s bytes); open it with "
              "`go tool pprof %s`\n",
              f.service.c_str(), RangeText(f).c_str(), WithThousands(r.total_samples()).c_str(),
              o.output.c_str(), WithThousands(r.data().size()).c_str(), o.output.c_str());
  return 0;
}

struct BaseOptions {
  std::string service;
  std::optional<std::string> select;  // unset: the compared profile's selector
  std::string since;
  std::string from, to;
  std::string by = "function";  // or "line"
  bool language_self = false;   // with by "line"
};

std::string Signed(double v) { return absl::StrFormat("%+.2f", v); }

// The lines whose share of self samples moved most (DiffRequest.by_line).
void PrintLineDiff(const v1::DiffResponse& r) {
  std::printf("\nLines (change of self share in percentage points; %s and %s samples without "
              "line information):\n",
              WithThousands(r.base_unresolved_samples()).c_str(),
              WithThousands(r.unresolved_samples()).c_str());
  Table lines({"ΔSELF", "BASE SELF%", "SELF%", "LINE", "FUNCTION", "INLINED INTO"}, {0, 1, 2});
  for (const v1::LineDelta& l : r.lines()) {
    if (l.frames_size() == 0) continue;
    std::vector<std::string> row{Signed(l.self_delta_pct()),
                                 Percent(l.base_self(), r.base_total_samples()),
                                 Percent(l.self(), r.total_samples())};
    AppendLineCells(l.frames(), &row);
    lines.AddRow(std::move(row));
  }
  std::fputs(lines.ToString().c_str(), stdout);
}

int RunDiff(CliContext* ctx, const FilterOptions& f, const BaseOptions& b) {
  if (b.language_self && b.by != "line") {
    Fail("--language-self counts lines: it needs --by line");
  }
  Client& client = ctx->client();
  v1::DiffRequest request;
  *request.mutable_filter() = BuildFilter(f);
  request.set_limit(f.limit);
  request.set_by_line(b.by == "line");
  request.set_language_self(b.language_self);
  v1::ProfileFilter* base = request.mutable_base();
  base->set_service(b.service.empty() ? f.service : b.service);
  base->set_host(f.host);
  base->set_focus(f.focus);
  base->set_ignore(f.ignore);
  base->set_selector(b.select.value_or(f.select));
  base->set_type(request.filter().type());
  std::string base_text;
  const int64_t current_from = request.filter().range().from_ms();
  if (!b.from.empty()) {
    FilterOptions bf;
    bf.from = b.from;
    bf.to = b.to;
    if (bf.to.empty()) bf.to = FormatRfc3339(current_from);
    *base->mutable_range() = BuildFilter(bf, "--base-").range();
    if (b.to.empty()) base->mutable_range()->set_to_ms(current_from);
    base_text = RangeText(bf);
  } else if (!b.to.empty()) {
    Fail("--base-to needs --base-from");
  } else if (!b.since.empty()) {
    auto d = ParseDuration(b.since);
    if (!d.ok()) Fail(absl::StrCat("--base-since: ", d.status().message()));
    const int64_t from = base::NowMs() - *d;
    if (from >= current_from) {
      Fail(absl::StrCat("--base-since ", b.since,
                        " must reach further back than the compared range (", RangeText(f), ")"));
    }
    base->mutable_range()->set_from_ms(from);
    base->mutable_range()->set_to_ms(current_from);
    base_text = absl::StrCat("last ", b.since, " before it");
  } else {
    base_text = b.service.empty() && base->selector() == f.select ? "the period before"
                                                                  : "the same range";
  }
  auto r = client.Call(client.query(), &v1::Query::Stub::Diff, request);
  WarnUnreachable(r.unreachable_nodes());
  if (ctx->options().json) return PrintJson(r), 0;
  auto with_selector = [](const std::string& service, const std::string& selector) {
    return selector.empty() ? service : absl::StrCat(service, " {", selector, "}");
  };
  std::printf("Diff of %s (%s, %s samples) against %s (%s, %s samples)\n",
              with_selector(f.service, f.select).c_str(), RangeText(f).c_str(),
              WithThousands(r.total_samples()).c_str(),
              with_selector(base->service(), base->selector()).c_str(), base_text.c_str(),
              WithThousands(r.base_total_samples()).c_str());
  if (r.total_samples() == 0 && r.base_total_samples() == 0) {
    std::printf(request.by_line() && !request.language_self()
                    ? "No leaf addresses in either range.\n"
                    : "No samples in either range.\n");
    return 0;
  }
  // Against nothing every function is new, at its whole share: say so before the table does.
  if (r.total_samples() == 0 || r.base_total_samples() == 0) {
    std::printf("warning: the %s has no samples; every change below is all of a share\n",
                r.base_total_samples() == 0 ? "base range" : "compared range");
  }
  if (request.by_line()) return PrintLineDiff(r), 0;
  std::printf("\nFunctions (change of share in percentage points):\n");
  Table functions({"ΔSELF", "BASE SELF%", "SELF%", "ΔTOTAL", "BASE TOTAL%", "TOTAL%", "FUNCTION"},
                  {0, 1, 2, 3, 4, 5});
  for (const auto& fn : r.functions()) {
    functions.AddRow({Signed(fn.self_delta_pct()), Percent(fn.base_self(), r.base_total_samples()),
                      Percent(fn.self(), r.total_samples()), Signed(fn.total_delta_pct()),
                      Percent(fn.base_total(), r.base_total_samples()),
                      Percent(fn.total(), r.total_samples()), FrameText(fn.function())});
  }
  std::fputs(functions.ToString().c_str(), stdout);
  std::printf("\nPaths:\n");
  Table paths({"Δ", "BASE%", "NOW%", "PATH"}, {0, 1, 2});
  for (const auto& p : r.paths()) {
    paths.AddRow({Signed(p.delta_pct()), Percent(p.base_samples(), r.base_total_samples()),
                  Percent(p.samples(), r.total_samples()), PathText(p)});
  }
  std::fputs(paths.ToString().c_str(), stdout);
  return 0;
}

int RunQuality(CliContext* ctx, const FilterOptions& f) {
  Client& client = ctx->client();
  v1::QualityRequest request;
  *request.mutable_filter() = BuildFilter(f);
  auto r = client.Call(client.query(), &v1::Query::Stub::Quality, request);
  WarnUnreachable(r.unreachable_nodes());
  if (ctx->options().json) return PrintJson(r), 0;
  std::printf("Stack quality of %s (%s, %s samples)\n", f.service.c_str(), RangeText(f).c_str(),
              WithThousands(r.samples()).c_str());
  if (r.samples() == 0) {  // "0.00 % complete" would read as broken stacks
    std::fputs(NoSamplesText(f).c_str(), stdout);
    return 0;
  }
  std::printf("  complete stacks   %s (%s truncated)\n",
              absl::StrFormat("%.2f%%", r.complete_pct()).c_str(),
              WithThousands(r.truncated_samples()).c_str());
  std::printf("  depth             mean %.1f, max %u; truncated stacks mean %.1f, max %u\n",
              r.mean_depth(), r.max_depth(), r.mean_truncated_depth(), r.max_truncated_depth());
  std::printf("  unnamed frames    %s of %s (%s)\n", WithThousands(r.unnamed_frames()).c_str(),
              WithThousands(r.frames()).c_str(), Percent(r.unnamed_frames(), r.frames()).c_str());
  if (!r.frames_by_kind().empty()) {
    std::string kinds;
    for (const v1::FrameKindCount& k : r.frames_by_kind()) {
      absl::StrAppend(&kinds, kinds.empty() ? "" : ", ", k.kind(), " ",
                      WithThousands(k.frames()));
      if (k.unnamed_frames() > 0) {
        absl::StrAppend(&kinds, " (", WithThousands(k.unnamed_frames()), " unnamed)");
      }
    }
    std::printf("  frames by kind    %s\n", kinds.c_str());
  }
  // The agents' counters are kept per batch, for the service as a whole: a narrower selection
  // does not apply to them (QualityResponse.agent_stacks).
  const bool narrowed =
      !f.host.empty() || !f.select.empty() || !f.focus.empty() || !f.ignore.empty();
  std::printf("  agents            %s%s stacks, %s truncated, %s verification failures, "
              "JIT frames %s by rules and %s by frame pointers, %s samples lost\n",
              narrowed ? "(the whole service's) " : "", WithThousands(r.agent_stacks()).c_str(),
              WithThousands(r.agent_truncated()).c_str(),
              WithThousands(r.verify_failures()).c_str(), WithThousands(r.jit_frames_cfi()).c_str(),
              WithThousands(r.jit_frames_fp()).c_str(), WithThousands(r.lost_samples()).c_str());
  if (r.python_frames() > 0 || r.python_stale() > 0) {
    std::printf("  python            %s frames read from interpreters, %s stacks whose Python "
                "frames changed before they were read (eval-loop frames kept)\n",
                WithThousands(r.python_frames()).c_str(), WithThousands(r.python_stale()).c_str());
  }
  if (r.binaries().empty()) return 0;
  std::printf("\n");
  Table table({"FRAMES", "UNNAMED", "UNNAMED%", "STOPPED HERE", "KIND", "MODULE", "BUILD ID",
               "HINT"},
              {0, 1, 2, 3});
  int rows = 0;
  for (const auto& b : r.binaries()) {
    if (rows++ == static_cast<int>(f.limit)) break;
    table.AddRow({WithThousands(b.frames()), WithThousands(b.unnamed_frames()),
                  Percent(b.unnamed_frames(), b.frames()), WithThousands(b.truncated_here()),
                  b.kind(), b.module(), b.build_id().empty() ? "-" : b.build_id(), b.hint()});
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
  static std::string labels_service;
  auto* labels = app->add_subcommand("labels", "label keys and values of a service's targets");
  labels->add_option("--service,-s", labels_service, "service name")->required();
  labels->callback([=] { *exit_code = RunLabels(ctx, labels_service); });

  static FilterOptions top_filter, paths_filter;
  static std::string sort = "self", by = "function";
  static bool top_language = false;
  auto* top = app->add_subcommand("top", "functions by self or total samples, or source lines");
  AddFilterFlags(top, &top_filter);
  top->add_option("--sort", sort, "self or total")
      ->check(CLI::IsMember({"self", "total"}))
      ->capture_default_str();
  top->add_option("--by", by,
                  "function, or line: self samples per source line with inlined functions "
                  "(needs the modules' DWARF on the server)")
      ->check(CLI::IsMember({"function", "line"}))
      ->capture_default_str();
  top->add_flag("--language-self", top_language,
                "with --by line: each sample at its innermost Python or Java frame's line (the "
                "native code that code calls counted there), from the stacks: every filter "
                "applies");
  top->callback(
      [=] { *exit_code = RunTop(ctx, top_filter, sort == "total", by == "line", top_language); });

  auto* hot_paths = app->add_subcommand("hot-paths", "hottest full call paths");
  AddFilterFlags(hot_paths, &paths_filter);
  hot_paths->callback([=] { *exit_code = RunHotPaths(ctx, paths_filter); });

  static FilterOptions flame_filter, diff_filter, export_filter;
  static FlameOptions flame;
  auto* flamegraph = app->add_subcommand("flamegraph", "flame graph as SVG, HTML, folded or JSON");
  AddFilterFlags(flamegraph, &flame_filter);
  flamegraph->add_option("--format,-f", flame.format, "svg, html, folded or json")
      ->check(CLI::IsMember({"svg", "html", "folded", "json"}))
      ->capture_default_str();
  flamegraph->add_option("--output,-o", flame.output, "file to write (default: stdout)");
  flamegraph->add_option("--max-nodes", flame.max_nodes,
                         "keep at most this many tree nodes (default 16384; not for folded)");
  flamegraph->add_flag("--lines", flame.lines,
                       "source lines instead of functions: callers at their call sites, leaves "
                       "at their lines, inlined functions as frames (where the server has DWARF)");
  flamegraph->callback([=] { *exit_code = RunFlameGraph(ctx, flame_filter, flame); });

  static BaseOptions base;
  auto* diff = app->add_subcommand(
      "diff", "what changed between two ranges of a service, or between two services");
  AddFilterFlags(diff, &diff_filter);
  diff->add_option("--base-service", base.service, "compare against this service");
  CLI::Option* base_since =
      diff->add_option("--base-since", base.since,
                       "base range: from this far back up to the start of the compared range");
  diff->add_option("--base-from", base.from, "base range start, RFC 3339")->excludes(base_since);
  diff->add_option("--base-to", base.to,
                   "base range end, RFC 3339, exclusive (default: compared start)")
      ->excludes(base_since);
  diff->add_option("--base-select,--select-a", base.select,
                   "base profile: targets whose labels match (default: --select); with a "
                   "different selector the base is the same range, e.g. --select-a version=1 "
                   "--select-b version=2");
  diff->add_option("--select-b", diff_filter.select, "compared profile's selector (= --select)");
  diff->add_option("--by", base.by,
                   "function, or line: each source line's change of self share (needs the "
                   "modules' DWARF on the server; ranges, services and --host only)")
      ->check(CLI::IsMember({"function", "line"}))
      ->capture_default_str();
  diff->add_flag("--language-self", base.language_self,
                 "with --by line: lines as top --by line --language-self counts them (every "
                 "filter applies, --select-a/--select-b too)");
  diff->footer(
      "Without base range flags the base is the equally long range just before the compared "
      "one, or with --base-service or --base-select the same range of that service or those "
      "targets.");
  diff->callback([=] { *exit_code = RunDiff(ctx, diff_filter, base); });

  static FilterOptions quality_filter;
  auto* quality = app->add_subcommand(
      "quality",
      "stack quality: truncation, unnamed frames per binary, agents' unwinding counters");
  AddFilterFlags(quality, &quality_filter);
  quality->callback([=] { *exit_code = RunQuality(ctx, quality_filter); });

  static ExportOptions export_options;
  auto* exp =
      app->add_subcommand("export", "write the profile for other tools (pprof, LLVM FDO, OTLP)");
  AddFilterFlags(exp, &export_filter);
  exp->add_option("--format,-f", export_options.format,
                  "pprof (gzipped profile.proto) or llvm-sample (text; for clang "
                  "-fprofile-sample-use, from source lines: needs the modules' DWARF) or otlp "
                  "(an OTLP profiles ExportProfilesServiceRequest, one resource per host)")
      ->check(CLI::IsMember({"pprof", "llvm-sample", "otlp"}))
      ->capture_default_str();
  exp->add_option("--output,-o", export_options.output, "file to write, e.g. cpu.pb.gz")
      ->required();
  exp->callback([=] { *exit_code = RunExport(ctx, export_filter, export_options); });
}

}  // namespace strata::cli
