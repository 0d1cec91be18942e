// Cost of naming one frame on the server, next to addr2line on the same addresses.
//
// Subject: the strata-agent binary (RelWithDebInfo: -O2 -g, a few hundred compilation units of
// C++ with heavy inlining; the server would do too, but most of its code is Debian's static
// RocksDB without DWARF), or --subject=FILE. Addresses: every function symbol's
// start plus a point inside it, up to --addresses=N (default 4000), in address order.
//
//   SourceLines/Cold    Open + the inline chain of every address once (unit indexing, line
//                       tables decoded on first use): a query's first look at a module
//   SourceLines/Warm    the same addresses again on an open SourceLines
//   Symbolizer/Names    function names by build ID and offset (symbol table), warm
//   Addr2line           `addr2line -i -f -C -e FILE` over the same addresses in one process
//                       (its start-up and DWARF reading included), the anchor
//
// Each reports per_frame: wall time per address (addr2line runs in a child process).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "common/elf/elf_file.h"
#include "server/symbolize/source_lines.h"
#include "server/symbolize/symbolizer.h"

namespace strata::server::symbolize {
namespace {

std::string g_subject = STRATA_BENCH_SUBJECT;
size_t g_max_addresses = 4000;

struct Subject {
  std::string build_id;
  std::vector<uint64_t> addresses;
};

const Subject& TheSubject() {
  static const Subject subject = [] {
    Subject s;
    auto elf = elf::ElfFile::Open(g_subject);
    if (!elf.ok()) {
      std::fprintf(stderr, "symbolize_benchmark: %s: %s\n", g_subject.c_str(),
                   elf.status().ToString().c_str());
      std::exit(2);
    }
    s.build_id = (*elf)->BuildIdHex();
    auto symbols = (*elf)->ReadFunctionSymbols();
    if (!symbols.ok() || symbols->empty()) {
      std::fprintf(stderr, "symbolize_benchmark: %s has no function symbols\n", g_subject.c_str());
      std::exit(2);
    }
    // Spread over the whole binary: every k-th function, its entry and its middle.
    const size_t step = std::max<size_t>(1, 2 * symbols->size() / g_max_addresses);
    for (size_t i = 0; i < symbols->size() && s.addresses.size() < g_max_addresses; i += step) {
      const elf::FunctionSymbol& f = (*symbols)[i];
      if (f.size == 0) continue;
      s.addresses.push_back(f.start);
      s.addresses.push_back(f.start + f.size / 2);
    }
    std::sort(s.addresses.begin(), s.addresses.end());
    return s;
  }();
  return subject;
}

void PerFrame(benchmark::State& state, size_t frames, size_t found) {
  state.counters["per_frame"] = benchmark::Counter(
      static_cast<double>(frames) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["addresses"] = static_cast<double>(frames);
  state.counters["with_lines"] = static_cast<double>(found);
}

// Addresses of `subject` that have source frames.
size_t WithFrames(const SourceLines& lines, const Subject& subject) {
  size_t found = 0;
  for (uint64_t a : subject.addresses) found += !lines.Frames(a).empty();
  return found;
}

void BM_SourceLinesCold(benchmark::State& state) {
  const Subject& subject = TheSubject();
  size_t found = 0;
  for (auto _ : state) {
    auto lines = SourceLines::Open(g_subject);
    if (!lines.ok()) {
      state.SkipWithError(lines.status().ToString().c_str());
      return;
    }
    found = WithFrames(**lines, subject);
    benchmark::DoNotOptimize(found);
  }
  PerFrame(state, subject.addresses.size(), found);
}
BENCHMARK(BM_SourceLinesCold)->Name("SourceLines/Cold")->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_SourceLinesWarm(benchmark::State& state) {
  const Subject& subject = TheSubject();
  auto lines = SourceLines::Open(g_subject);
  if (!lines.ok()) {
    state.SkipWithError(lines.status().ToString().c_str());
    return;
  }
  size_t found = WithFrames(**lines, subject);  // warms every unit the addresses touch
  for (auto _ : state) {
    found = WithFrames(**lines, subject);
    benchmark::DoNotOptimize(found);
  }
  PerFrame(state, subject.addresses.size(), found);
}
BENCHMARK(BM_SourceLinesWarm)->Name("SourceLines/Warm")->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_SymbolizerNames(benchmark::State& state) {
  const Subject& subject = TheSubject();
  // The subject found by build ID in a local debug directory (--debug-dirs).
  char dir_template[] = "/tmp/strata_symbolize_bench_XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    state.SkipWithError("mkdtemp");
    return;
  }
  const std::string dir = dir_template;
  const std::string link_dir = absl::StrCat(dir, "/.build-id/", subject.build_id.substr(0, 2));
  std::error_code ec;
  std::filesystem::create_directories(link_dir, ec);
  const std::string link = absl::StrCat(link_dir, "/", subject.build_id.substr(2), ".debug");
  if (ec || symlink(g_subject.c_str(), link.c_str()) != 0) {
    state.SkipWithError("cannot link the subject into a debug directory");
    std::filesystem::remove_all(dir, ec);
    return;
  }
  SymbolizerOptions options;
  options.debug_dirs = {dir};
  Symbolizer symbolizer(options, nullptr);
  size_t found = 0;
  for (uint64_t a : subject.addresses) found += symbolizer.FunctionName(subject.build_id, a).has_value();
  for (auto _ : state) {
    found = 0;
    for (uint64_t a : subject.addresses) {
      found += symbolizer.FunctionName(subject.build_id, a).has_value();
    }
    benchmark::DoNotOptimize(found);
  }
  PerFrame(state, subject.addresses.size(), found);
  std::filesystem::remove_all(dir, ec);
}
BENCHMARK(BM_SymbolizerNames)->Name("Symbolizer/Names")->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Addr2line(benchmark::State& state) {
  const Subject& subject = TheSubject();
  char path_template[] = "/tmp/strata_symbolize_bench_addresses_XXXXXX";
  const int fd = mkstemp(path_template);
  if (fd < 0) {
    state.SkipWithError("mkstemp");
    return;
  }
  close(fd);
  const std::string path = path_template;
  {
    std::ofstream out(path);
    for (uint64_t a : subject.addresses) out << "0x" << std::hex << a << "\n";
  }
  const std::string command = absl::StrCat(STRATA_BENCH_ADDR2LINE, " -i -f -C -e '", g_subject,
                                           "' < '", path, "'");
  size_t lines = 0;
  for (auto _ : state) {
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) {
      state.SkipWithError("popen");
      break;
    }
    char buffer[4096];
    lines = 0;
    while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) ++lines;
    if (pclose(pipe) != 0) {
      state.SkipWithError("addr2line failed");
      break;
    }
  }
  PerFrame(state, subject.addresses.size(), lines / 2);
  unlink(path.c_str());
}
BENCHMARK(BM_Addr2line)->Name("Addr2line")->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace strata::server::symbolize

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--subject=", 0) == 0) {
      char* absolute = realpath(arg.substr(10).c_str(), nullptr);  // linked to from a temp dir
      strata::server::symbolize::g_subject = absolute != nullptr ? absolute : arg.substr(10);
      std::free(absolute);
    } else if (arg.rfind("--addresses=", 0) == 0) {
      strata::server::symbolize::g_max_addresses = std::stoul(arg.substr(12));
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  std::printf("subject %s: %zu addresses\n", strata::server::symbolize::g_subject.c_str(),
              strata::server::symbolize::TheSubject().addresses.size());
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
