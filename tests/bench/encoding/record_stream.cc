// Records a process's sample stream for encoding_benchmark with the agent's own pipeline: the
// Profiler samples and unwinds the target, the IntervalAggregator counts and encodes each
// interval into SampleBatch.packed_contexts, and every batch is unpacked and decoded back to
// outer->leaf frames (function, call site) exactly as the server would. The result is written
// in the text format of sample_stream.h (one interval per batch). It also reports the
// recorder's own CPU time (sampling + unwinding + aggregation + encoding, no network).
//
//   record_stream --pid=PID --out=FILE [--seconds=60] [--interval=10] [--frequency=99]
#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "agent/core/context_graph.h"
#include "agent/core/profiler.h"
#include "common/encoding/packed_contexts.h"
#include "tools/loadgen/sample_stream.h"

namespace {

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// Function names as the stream format can carry them: unique per graph node, without the
// separators of the format.
class Names {
 public:
  explicit Names(strata::agent::ContextGraph* graph, strata::loadgen::SampleStream* stream)
      : graph_(graph), stream_(stream) {}

  // Stream function index of graph node `node`.
  uint32_t Of(strata::encoding::NodeId node) {
    if (node >= known_) Refresh();
    auto it = index_.find(node);
    return it == index_.end() ? Add(node, absl::StrCat("node", node)) : it->second;
  }

 private:
  void Refresh() {
    const strata::v1::GraphDelta delta = graph_->DeltaFrom(known_, graph_->num_edges());
    for (const auto& n : delta.nodes()) {
      std::string name = absl::StrReplaceAll(n.name(), {{";", ":"}, {"\n", " "}, {"+0x", "@0x"}});
      if (name.empty() || name == "[truncated]") name = absl::StrCat("node", n.id());
      Add(n.id(), name);
    }
    known_ = static_cast<uint32_t>(delta.first_node() + delta.nodes_size());
  }
  uint32_t Add(strata::encoding::NodeId node, std::string name) {
    // Different functions with one name (e.g. two modules) stay apart.
    if (!used_.insert(name).second) name = absl::StrCat(name, "#", node);
    used_.insert(name);
    const uint32_t index = static_cast<uint32_t>(stream_->function_names.size());
    stream_->function_names.push_back(std::move(name));
    index_[node] = index;
    return index;
  }

  strata::agent::ContextGraph* graph_;
  strata::loadgen::SampleStream* stream_;
  uint32_t known_ = strata::encoding::kFirstFunctionNode;
  absl::flat_hash_map<strata::encoding::NodeId, uint32_t> index_;
  absl::flat_hash_set<std::string> used_;
};

int Run(int argc, char** argv) {
  int pid = 0;
  std::string out_path;
  double seconds = 60, interval_s = 10;
  uint32_t frequency = 99;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&](std::string_view flag) -> std::string {
      return a.substr(0, flag.size()) == flag ? std::string(a.substr(flag.size())) : "";
    };
    bool ok = true;
    if (a.starts_with("--pid=")) {
      ok = absl::SimpleAtoi(value("--pid="), &pid);
    } else if (a.starts_with("--out=")) {
      out_path = value("--out=");
    } else if (a.starts_with("--seconds=")) {
      ok = absl::SimpleAtod(value("--seconds="), &seconds);
    } else if (a.starts_with("--interval=")) {
      ok = absl::SimpleAtod(value("--interval="), &interval_s);
    } else if (a.starts_with("--frequency=")) {
      ok = absl::SimpleAtoi(value("--frequency="), &frequency);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "record_stream: bad argument %s\n", argv[i]);
      return 2;
    }
  }
  if (pid <= 0 || out_path.empty()) {
    std::fprintf(stderr, "usage: record_stream --pid=PID --out=FILE [--seconds=60] "
                         "[--interval=10] [--frequency=99]\n");
    return 2;
  }

  strata::agent::ContextGraph graph(0x5eed);
  strata::agent::ProfilerOptions options;
  options.frequency_hz = frequency;
  options.pids = {static_cast<pid_t>(pid)};
  auto profiler = strata::agent::Profiler::Create(options, &graph);
  if (!profiler.ok()) {
    std::fprintf(stderr, "record_stream: %s\n", profiler.status().ToString().c_str());
    return 1;
  }
  strata::loadgen::SampleStream stream;
  Names names(&graph, &stream);
  uint64_t sequence = 0, samples = 0, contexts = 0, packed_bytes = 0, batch_bytes = 0;
  double encode_cpu = 0;

  const double cpu_start = CpuSeconds();
  const absl::Time start = absl::Now(), end = start + absl::Seconds(seconds);
  absl::Time window_start = start, window_end = start + absl::Seconds(interval_s);
  auto ship = [&](absl::Time now) -> bool {
    const double c0 = CpuSeconds();
    auto batch = (*profiler)->TakeBatch(absl::ToUnixMillis(window_start), absl::ToUnixMillis(now),
                                        sequence + 1);
    encode_cpu += CpuSeconds() - c0;
    window_start = now;
    if (!batch.ok()) {
      std::fprintf(stderr, "record_stream: batch: %s\n", batch.status().ToString().c_str());
      return false;
    }
    if (!batch->has_value()) return true;
    ++sequence;
    const strata::v1::SampleBatch& b = **batch;
    auto numbering = graph.CurrentNumbering();
    auto records = strata::encoding::DecodePackedContexts(b.packed_contexts());
    if (!numbering.ok() || (*numbering)->epoch() != b.epoch() || !records.ok()) {
      std::fprintf(stderr, "record_stream: batch %llu does not unpack\n",
                   static_cast<unsigned long long>(sequence));
      return false;
    }
    packed_bytes += b.packed_contexts().size();
    batch_bytes += b.ByteSizeLong();
    contexts += records->size();
    auto& interval = stream.intervals.emplace_back();
    for (const auto& r : *records) {
      bool truncated = false;
      auto path = strata::encoding::Decode(**numbering, r.context, &truncated);
      if (!path.ok()) {
        std::fprintf(stderr, "record_stream: %s\n", path.status().ToString().c_str());
        return false;
      }
      strata::loadgen::StreamStack& s = interval.emplace_back();
      s.truncated = truncated;
      s.count = r.count;
      samples += r.count;
      for (const auto& f : *path) s.frames.push_back({names.Of(f.function), f.call_site});
    }
    return true;
  };
  for (absl::Time now = absl::Now(); now < end; now = absl::Now()) {
    if (auto st = (*profiler)->Poll(std::min(absl::Milliseconds(200), window_end - now));
        !st.ok()) {
      std::fprintf(stderr, "record_stream: %s\n", st.ToString().c_str());
    }
    now = absl::Now();
    if (now >= window_end || (*profiler)->batch_full()) {
      if (!ship(now)) return 1;
      window_end = now + absl::Seconds(interval_s);
    }
  }
  if (!ship(absl::Now())) return 1;
  const double cpu = CpuSeconds() - cpu_start;
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);

  std::ofstream out(out_path);
  out << "# recorded by record_stream from pid " << pid << " at " << frequency << " Hz, "
      << interval_s << " s intervals\n"
      << strata::loadgen::FormatSampleStream(stream);
  if (!out) {
    std::fprintf(stderr, "record_stream: cannot write %s\n", out_path.c_str());
    return 1;
  }
  const auto stats = (*profiler)->stats();
  std::printf("recorded %zu intervals, %llu samples, %llu contexts (%.1f per batch), %zu "
              "functions, graph %u nodes / %llu edges\n",
              stream.intervals.size(), static_cast<unsigned long long>(samples),
              static_cast<unsigned long long>(contexts),
              stream.intervals.empty() ? 0.0 : double(contexts) / stream.intervals.size(),
              stream.function_names.size(), graph.num_nodes(),
              static_cast<unsigned long long>(graph.num_edges()));
  std::printf("packed_contexts v%d (all intervals): %.2f bytes per context, %.3f per sample; "
              "whole SampleBatch %.2f bytes per context\n",
              strata::encoding::kPackedContextsVersion,
              contexts ? double(packed_bytes) / contexts : 0.0,
              samples ? double(packed_bytes) / samples : 0.0,
              contexts ? double(batch_bytes) / contexts : 0.0);
  std::printf("profiler: %llu samples, %llu truncated, %llu lost, %llu frames walked, %llu "
              "reused\n",
              static_cast<unsigned long long>(stats.samples),
              static_cast<unsigned long long>(stats.truncated),
              static_cast<unsigned long long>(stats.lost),
              static_cast<unsigned long long>(stats.frames_walked),
              static_cast<unsigned long long>(stats.frames_reused));
  std::printf("cpu: %.3f s over %.1f s wall (%.2f%% of a core); %.1f us per sample; batch "
              "building (TakeBatch) %.3f ms per batch\n",
              cpu, wall, 100 * cpu / wall, samples ? 1e6 * cpu / samples : 0.0,
              sequence ? 1e3 * encode_cpu / sequence : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
