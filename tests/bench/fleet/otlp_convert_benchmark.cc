// What OTLP ingest's conversion (server/otlp: an Export request to Strata's functions, stacks
// and cells) costs per sample, beside parsing the same requests, on the load generator's
// default program: 16 intervals of an agent, as the OpenTelemetry eBPF profiler sends them
// (tests/bench/fleet/otlp.sh drives a server with the same requests).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "server/otlp/otlp_convert.h"
#include "tools/loadgen/program.h"

namespace strata {
namespace {

struct Requests {
  std::vector<server::otlp::otlp_v1::ExportProfilesServiceRequest> parsed;
  std::vector<std::string> serialized;
  uint64_t samples = 0;
};

const Requests& TheRequests() {
  static const Requests* requests = [] {
    loadgen::ProgramOptions options;
    options.otlp = true;
    auto program = loadgen::Program::Build(options);
    if (!program.ok()) std::abort();
    auto* r = new Requests;
    for (uint64_t i = 0; i < 16; ++i) {
      r->parsed.push_back(loadgen::OtlpRequestOf(
          (*program)->payload(i), {{"service.name", "bench"}, {"host.name", "bench-host"}},
          uint64_t{1'700'000'000} * 1'000'000'000 + i * 10'000'000'000));
      r->serialized.push_back(r->parsed.back().SerializeAsString());
      r->samples += (*program)->payload(i).samples;
    }
    return r;
  }();
  return *requests;
}

// items_per_second: samples per second (Time / samples per iteration: the time per sample).
void PerSample(benchmark::State& state, uint64_t samples_per_iteration) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * samples_per_iteration));
  state.counters["samples"] = static_cast<double>(samples_per_iteration);
}

// The anchor: parsing the requests, what any OTLP receiver does first.
void BM_ParseOtlp(benchmark::State& state) {
  const Requests& r = TheRequests();
  server::otlp::otlp_v1::ExportProfilesServiceRequest parsed;
  for (auto _ : state) {
    for (const std::string& bytes : r.serialized) {
      if (!parsed.ParseFromString(bytes)) state.SkipWithError("parse");
      benchmark::DoNotOptimize(parsed);
    }
  }
  PerSample(state, r.samples);
}
BENCHMARK(BM_ParseOtlp);

// The conversion of the parsed requests, checked to keep every sample.
void BM_ConvertOtlp(benchmark::State& state) {
  const Requests& r = TheRequests();
  const server::ingest::IngestLimits limits;
  const int64_t now_ms = int64_t{1'700'000'000} * 1000;
  for (auto _ : state) {
    uint64_t samples = 0;
    for (const auto& request : r.parsed) {
      auto converted = server::otlp::ConvertRequest(request, limits, "", now_ms);
      if (!converted.ok()) state.SkipWithError(std::string(converted.status().message()).c_str());
      else samples += converted->samples;
    }
    if (samples != r.samples) state.SkipWithError("samples lost");
  }
  PerSample(state, r.samples);
}
BENCHMARK(BM_ConvertOtlp);

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
