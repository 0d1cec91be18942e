// Every frame named: the real agent, server and CLI on loopback, with debug information from
// Debian's libc6-dbg (/usr/lib/debug/.build-id), from a real debuginfod serving a directory
// on loopback, and from `strata debuginfo upload` after the samples were stored.
//
// The stripped workloads are copies of demo_service made here, the way Debian builds
// packages: `objcopy --only-keep-debug` for the debug file, then `strip --strip-all`. The
// agent cannot name their functions (no .symtab, no debug link); only the server can.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <tuple>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/elf/elf_file.h"
#include "common/testing/free_port.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/otlp/otlp_builder.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/http_client.h"

namespace strata::e2e {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

std::string BuildIdOf(const std::string& path) {
  auto elf = elf::ElfFile::Open(path);
  return elf.ok() ? (*elf)->BuildIdHex() : "";
}

// A stripped copy of demo_service at `binary` and its debug file at `debug_file`.
void MakeStrippedDemo(const std::string& binary, const std::string& debug_file) {
  fs::create_directories(fs::path(debug_file).parent_path());
  const std::string demo = BinPath("demo_service");
  for (const std::string& command :
       {absl::StrCat("objcopy --only-keep-debug '", demo, "' '", debug_file, "'"),
        absl::StrCat("strip --strip-all -o '", binary, "' '", demo, "'")}) {
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  auto elf = elf::ElfFile::Open(binary);
  ASSERT_TRUE(elf.ok());
  ASSERT_EQ((*elf)->FindSection(".symtab"), nullptr) << "strip left a symbol table";
  ASSERT_EQ((*elf)->FindSection(".gnu_debuglink"), nullptr);
}

// Runs the agent on `pid` until the server holds `samples` of `service`, then stops it.
void Profile(const ServerProcess& server, pid_t pid, const std::string& service,
             uint64_t samples, const std::string& agent_log) {
  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(pid), "--interval", "1", "--frequency", "199"},
                     agent_log);
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (ServiceTotal(server.address(), service) < samples && absl::Now() < deadline &&
         agent.running()) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(agent.Stop(SIGTERM, 20), 0) << agent.Output();
  ASSERT_GE(ServiceTotal(server.address(), service), samples) << agent.Output();
}

std::string Top(const ServerProcess& server, const std::string& service) {
  CommandResult top = RunCommand({BinPath("strata"), "--server", server.address(), "top",
                                  "--service", service, "--since", "1h", "--limit", "40"});
  EXPECT_EQ(top.exit_code, 0) << top.output;
  return top.output;
}

uint64_t MetricValue(const std::string& metrics, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = metrics.find(key);
  return at == std::string::npos ? UINT64_MAX
                                 : std::strtoull(metrics.c_str() + at + key.size(), nullptr, 10);
}

TEST(DebugInfoTest, LibcFramesAreNamedFromLibc6Dbg) {
  const std::string libc = fs::canonical("/lib/x86_64-linux-gnu/libc.so.6").string();
  const std::string build_id = BuildIdOf(libc);
  const std::string debug_file = absl::StrCat("/usr/lib/debug/.build-id/", build_id.substr(0, 2),
                                              "/", build_id.substr(2), ".debug");
  if (access(debug_file.c_str(), R_OK) != 0) {
    GTEST_SKIP() << debug_file << " is missing: install libc6-dbg (deploy/install-deps.sh)";
  }
  testing::TempDir dir("strata_e2e_libc_dbg");
  ServerProcess server(dir.File("data"), dir.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  ChildProcess demo({BinPath("demo_service"), "--threads", "2"}, dir.File("demo.log"),
                    {{"STRATA_SERVICE", "libc-named"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  Profile(server, demo.pid(), "libc-named", 400, dir.File("agent.log"));

  // Threads start in clone3 -> start_thread; without debug info these are
  // libc.so.6+0x1098e1 and libc.so.6+0x88ef0.
  CommandResult paths = RunCommand({BinPath("strata"), "--server", server.address(),
                                    "hot-paths", "--service", "libc-named", "--since", "1h"});
  ASSERT_EQ(paths.exit_code, 0) << paths.output;
  EXPECT_THAT(paths.output, HasSubstr("clone3 > start_thread")) << paths.output;
  EXPECT_THAT(paths.output, Not(HasSubstr("libc.so.6+0x"))) << paths.output;
  CommandResult quality = RunCommand({BinPath("strata"), "--server", server.address(),
                                      "quality", "--service", "libc-named", "--since", "1h"});
  ASSERT_EQ(quality.exit_code, 0) << quality.output;
  std::printf("%s\n", quality.output.c_str());
  EXPECT_THAT(quality.output, Not(HasSubstr("libc.so.6+"))) << quality.output;
}

TEST(DebugInfoTest, DebuginfodOnLoopbackNamesAStrippedWorkloadOnce) {
  testing::TempDir dir("strata_e2e_debuginfod");
  const std::string binary = dir.File("demo_stripped");
  const std::string debug_file = dir.File("debugfiles/demo_stripped.debug");
  ASSERT_NO_FATAL_FAILURE(MakeStrippedDemo(binary, debug_file));
  const std::string build_id = BuildIdOf(binary);
  ASSERT_FALSE(build_id.empty());

  // debuginfod scans the directory and serves the file by build ID.
  const int port = strata::testing::FreeLoopbackPort();
  ChildProcess debuginfod({"/usr/bin/debuginfod", "-F", dir.File("debugfiles"), "-p",
                           std::to_string(port), "-d", dir.File("debuginfod.sqlite"), "-t", "1"},
                          dir.File("debuginfod.log"));
  const absl::Time ready_by = absl::Now() + absl::Seconds(60);
  int status = 0;
  while (absl::Now() < ready_by && debuginfod.running()) {
    status = strata::testing::HttpGet(port, "/buildid/" + build_id + "/debuginfo").first;
    if (status == 200) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(status, 200) << debuginfod.Output();

  ServerProcess server(
      dir.File("data"), dir.File("server.log"),
      {"--http", "127.0.0.1:0", "--metrics-open", "--debug-dirs", dir.File("no-debug-dir"),
       "--debuginfod-urls", absl::StrCat("http://127.0.0.1:", port)});
  ASSERT_GT(server.port(), 0) << server.process().Output();
  ChildProcess demo({binary, "--threads", "1"}, dir.File("demo.log"),
                    {{"STRATA_SERVICE", "stripped"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  Profile(server, demo.pid(), "stripped", 300, dir.File("agent.log"));

  auto metric = [&](const std::string& name) {
    return MetricValue(strata::testing::HttpGet(server.http_port(), "/metrics").second, name);
  };
  const absl::Time first_start = absl::Now();
  const std::string first = Top(server, "stripped");
  const absl::Duration first_query = absl::Now() - first_start;
  EXPECT_THAT(first, HasSubstr("tokenize")) << first;
  EXPECT_THAT(first, HasSubstr("deflate_block")) << first;
  EXPECT_THAT(first, Not(HasSubstr("demo_stripped+0x"))) << first;
  // The workload's debug file came from debuginfod; the libraries without one (libstdc++
  // here) were asked for too, and not found.
  EXPECT_EQ(metric("strata_symbolize_debuginfod_found_total"), 1u);
  const uint64_t fetches = metric("strata_symbolize_debuginfod_fetches_total");
  EXPECT_GE(fetches, 1u);

  // Fetched once: the next queries are served from the server's memory, found and missing
  // build IDs alike.
  const absl::Time second_start = absl::Now();
  const std::string second = Top(server, "stripped");
  const absl::Duration second_query = absl::Now() - second_start;
  EXPECT_EQ(first, second);
  EXPECT_EQ(metric("strata_symbolize_debuginfod_fetches_total"), fetches);
  std::printf("first query (debuginfod fetches: %llu) %s, second (cached) %s\n",
              static_cast<unsigned long long>(fetches), absl::FormatDuration(first_query).c_str(),
              absl::FormatDuration(second_query).c_str());
  CommandResult ls = RunCommand({BinPath("strata"), "--server", server.address(), "debuginfo",
                                 "ls"});
  ASSERT_EQ(ls.exit_code, 0) << ls.output;
  EXPECT_THAT(ls.output, HasSubstr(build_id)) << ls.output;
  EXPECT_THAT(ls.output, HasSubstr("debuginfod")) << ls.output;
}

TEST(DebugInfoTest, AnUploadAfterIngestNamesFramesAlreadyStored) {
  testing::TempDir dir("strata_e2e_upload");
  const std::string binary = dir.File("demo_stripped");
  const std::string debug_file = dir.File("demo_stripped.debug");
  ASSERT_NO_FATAL_FAILURE(MakeStrippedDemo(binary, debug_file));
  const std::vector<std::string> server_args = {"--debug-dirs", dir.File("no-debug-dir")};
  auto server = std::make_unique<ServerProcess>(dir.File("data"), dir.File("server.log"),
                                                server_args);
  ASSERT_GT(server->port(), 0) << server->process().Output();
  {
    ChildProcess demo({binary, "--threads", "1"}, dir.File("demo.log"),
                      {{"STRATA_SERVICE", "late-symbols"}});
    ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
    Profile(*server, demo.pid(), "late-symbols", 300, dir.File("agent.log"));
  }
  const uint64_t total = ServiceTotal(server->address(), "late-symbols");
  const std::string before = Top(*server, "late-symbols");
  EXPECT_THAT(before, HasSubstr("demo_stripped+0x")) << before;
  EXPECT_THAT(before, Not(HasSubstr("tokenize"))) << before;

  // A file that is not ELF is refused with its reason; the server goes on.
  const std::string junk = dir.File("junk.debug");
  std::ofstream(junk) << "not an ELF file";
  CommandResult refused = RunCommand({BinPath("strata"), "--server", server->address(),
                                      "debuginfo", "upload", junk});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output, HasSubstr("not a usable ELF64 file")) << refused.output;

  CommandResult upload = RunCommand({BinPath("strata"), "--server", server->address(),
                                     "debuginfo", "upload", debug_file});
  ASSERT_EQ(upload.exit_code, 0) << upload.output << server->process().Output();
  EXPECT_THAT(upload.output, HasSubstr(BuildIdOf(binary))) << upload.output;
  const std::string after = Top(*server, "late-symbols");
  EXPECT_THAT(after, HasSubstr("tokenize")) << after;
  EXPECT_THAT(after, HasSubstr("deflate_block")) << after;
  EXPECT_THAT(after, HasSubstr("serve_forever")) << after;
  EXPECT_EQ(ServiceTotal(server->address(), "late-symbols"), total);

  // Uploads are kept with the data: after a restart the frames are still named.
  server.reset();
  server = std::make_unique<ServerProcess>(dir.File("data"), dir.File("server2.log"),
                                           server_args);
  ASSERT_GT(server->port(), 0) << server->process().Output();
  EXPECT_THAT(Top(*server, "late-symbols"), HasSubstr("tokenize"));
  CommandResult ls = RunCommand({BinPath("strata"), "--server", server->address(), "debuginfo",
                                 "ls"});
  ASSERT_EQ(ls.exit_code, 0) << ls.output;
  EXPECT_THAT(ls.output, HasSubstr("Uploaded debug files: 1")) << ls.output;
  EXPECT_THAT(ls.output, HasSubstr(debug_file)) << ls.output;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A source frame as compared here: function, file name (last component), line.
using Frame = std::tuple<std::string, std::string, uint32_t>;

std::string BaseName(std::string_view path) {
  const size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

// addr2line -i's frame chains (innermost first) for every address of `function` in `binary`.
std::set<std::vector<Frame>> Addr2lineChains(const std::string& binary,
                                             const std::string& function) {
  auto elf = elf::ElfFile::Open(binary);
  EXPECT_TRUE(elf.ok());
  if (!elf.ok()) return {};
  auto symbols = (*elf)->ReadFunctionSymbols();
  std::vector<std::string> argv = {"/usr/bin/addr2line", "-a", "-i", "-f", "-C", "-e", binary};
  for (const auto& s : *symbols) {
    if (s.name.rfind(function, 0) != 0 || s.size == 0) continue;
    for (uint64_t a = s.start; a < s.start + s.size; ++a) argv.push_back(absl::StrCat("0x", absl::Hex(a)));
  }
  EXPECT_GT(argv.size(), 7u) << function << " not found in " << binary;
  CommandResult out = RunCommand(argv);
  EXPECT_EQ(out.exit_code, 0) << out.output;
  std::set<std::vector<Frame>> chains;
  std::vector<Frame> chain;
  std::vector<std::string> lines = absl::StrSplit(out.output, '\n', absl::SkipEmpty());
  for (size_t i = 0; i < lines.size(); ++i) {
    if (absl::StartsWith(lines[i], "0x")) {  // -a: a new address
      if (!chain.empty()) chains.insert(chain);
      chain.clear();
      continue;
    }
    if (i + 1 >= lines.size()) break;
    std::string position = lines[++i];
    position = std::string(position.substr(0, position.find(" (discriminator")));
    const size_t colon = position.rfind(':');
    uint32_t line = 0;
    if (colon != std::string::npos) line = static_cast<uint32_t>(std::atoi(position.c_str() + colon + 1));
    chain.emplace_back(lines[i - 1], BaseName(position.substr(0, colon)), line);
  }
  if (!chain.empty()) chains.insert(chain);
  return chains;
}

TEST(DebugInfoTest, LinesAndInlinedFramesMatchAddr2line) {
  testing::TempDir dir("strata_e2e_inline");
  const std::string binary = BinPath("inline_spin");
  ServerProcess server(dir.File("data"), dir.File("server.log"),
                       {"--debug-dirs", dir.File("no-debug-dir"), "--http", "127.0.0.1:0"});
  ASSERT_GT(server.port(), 0) << server.process().Output();
  ASSERT_GT(server.http_port(), 0) << server.process().Output();
  ChildProcess spin({binary}, dir.File("spin.log"), {{"STRATA_SERVICE", "inline"}});
  ASSERT_TRUE(spin.WaitForOutput("ready", 30)) << spin.Output();
  Profile(server, spin.pid(), "inline", 300, dir.File("agent.log"));
  // The binary has its DWARF: uploaded after the samples, it gives them lines.
  CommandResult upload = RunCommand({BinPath("strata"), "--server", server.address(),
                                     "debuginfo", "upload", binary});
  ASSERT_EQ(upload.exit_code, 0) << upload.output;

  auto stub = v1::Query::NewStub(server.Channel());
  grpc::ClientContext context;
  v1::TopRequest request;
  request.mutable_filter()->set_service("inline");
  request.set_by_line(true);
  request.set_limit(1000);
  v1::TopResponse response;
  ASSERT_TRUE(stub->Top(&context, request, &response).ok());
  const std::set<std::vector<Frame>> expected = Addr2lineChains(binary, "Spin");
  ASSERT_FALSE(expected.empty());
  uint64_t in_spin = 0, inlined = 0;
  for (const v1::LineStat& l : response.lines()) {
    if (l.frames_size() == 0 || l.frames(l.frames_size() - 1).function().rfind("Spin", 0) != 0) {
      continue;
    }
    std::vector<Frame> chain;
    for (const v1::Frame& f : l.frames()) chain.emplace_back(f.function(), BaseName(f.file()), f.line());
    EXPECT_TRUE(expected.contains(chain)) << "not a chain addr2line -i gives for Spin: "
                                          << l.ShortDebugString();
    EXPECT_EQ(l.frames(0).inlined(), l.frames_size() > 1);
    in_spin += l.self();
    if (l.frames_size() > 1) inlined += l.self();
  }
  // The loop is nearly all Mix and Scale: most samples are in inlined code.
  EXPECT_GT(in_spin, response.total_samples() / 2) << response.ShortDebugString();
  EXPECT_GT(inlined, in_spin / 2) << response.ShortDebugString();

  CommandResult top = RunCommand({BinPath("strata"), "--server", server.address(), "top",
                                  "--by", "line", "--service", "inline", "--since", "1h"});
  ASSERT_EQ(top.exit_code, 0) << top.output;
  std::printf("%s\n", top.output.c_str());
  EXPECT_THAT(top.output, HasSubstr("Mix [inline]")) << top.output;
  EXPECT_THAT(top.output, HasSubstr("inline_spin.cc:")) << top.output;
  // pprof carries the leaf lines with their inline chains: go tool pprof -lines reads them.
  const std::string pprof_file = dir.File("inline.pb.gz");
  CommandResult exported = RunCommand({BinPath("strata"), "--server", server.address(), "export",
                                       "--service", "inline", "--since", "1h", "-o", pprof_file});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  ASSERT_EQ(RunCommand({"/bin/sh", "-c", "command -v go"}).exit_code, 0)
      << "go (golang-go) is missing: deploy/install-deps.sh installs it";
  CommandResult pprof = RunCommand({"/usr/bin/env", "HOME=" + dir.path(),
                                    "GOCACHE=" + dir.File("gocache"), "go", "tool", "pprof",
                                    "-top", "-lines", "-symbolize=none", pprof_file},
                                   120);
  ASSERT_EQ(pprof.exit_code, 0) << pprof.output;
  std::printf("%s\n", pprof.output.c_str());
  EXPECT_THAT(pprof.output, HasSubstr("Mix ")) << pprof.output;
  EXPECT_THAT(pprof.output, HasSubstr("inline_spin.cc:13")) << pprof.output;
  EXPECT_THAT(pprof.output, HasSubstr("(inline)")) << pprof.output;

  // Callers at their call sites: main calls Spin from Round, inlined into main. The flame
  // graph with lines has main's call-site chain (outermost first) above Spin, and it is the
  // chain addr2line -i gives for an address of main's, with Round marked inlined.
  const std::set<std::vector<Frame>> main_chains = Addr2lineChains(binary, "main");
  ASSERT_FALSE(main_chains.empty());
  CommandResult folded = RunCommand({BinPath("strata"), "--server", server.address(),
                                     "flamegraph", "--lines", "--format", "folded", "--service",
                                     "inline", "--since", "1h"});
  ASSERT_EQ(folded.exit_code, 0) << folded.output;
  uint64_t through_round = 0;
  const std::vector<std::string> folded_lines =
      absl::StrSplit(folded.output, '\n', absl::SkipEmpty());
  for (const std::string& line : folded_lines) {
    const size_t count_at = line.rfind(' ');
    ASSERT_NE(count_at, std::string::npos) << line;
    std::vector<std::string> frames = absl::StrSplit(line.substr(0, count_at), ';');
    auto main_at = std::find_if(frames.begin(), frames.end(),
                                [](const std::string& f) { return absl::StartsWith(f, "main "); });
    auto spin_at = std::find_if(frames.begin(), frames.end(),
                                [](const std::string& f) { return absl::StartsWith(f, "Spin"); });
    if (main_at == frames.end() || spin_at == frames.end() || spin_at < main_at) continue;
    // "name file:line" or "name file:line [inlined]", innermost first as addr2line gives it.
    std::vector<Frame> chain;
    bool round_inlined = false;
    for (auto it = spin_at; it != main_at;) {
      --it;
      std::string f = *it;
      const bool inlined = absl::EndsWith(f, " [inlined]");
      if (inlined) f.resize(f.size() - std::strlen(" [inlined]"));
      const size_t space = f.rfind(' '), colon = f.rfind(':');
      ASSERT_TRUE(space != std::string::npos && colon != std::string::npos && colon > space)
          << "no line in the frame '" << *it << "' of " << line;
      const std::string name(f.substr(0, space));
      round_inlined |= inlined && absl::StartsWith(name, "Round");
      chain.emplace_back(name, BaseName(f.substr(space + 1, colon - space - 1)),
                         static_cast<uint32_t>(std::atoi(f.c_str() + colon + 1)));
    }
    EXPECT_TRUE(main_chains.contains(chain)) << "not a chain addr2line -i gives for main: " << line;
    EXPECT_TRUE(round_inlined) << line;
    through_round += std::strtoull(line.c_str() + count_at + 1, nullptr, 10);
  }
  EXPECT_GT(through_round, response.total_samples() / 2) << folded.output;
  // The pprof export has the call site as a location of its own: pprof's cumulative view
  // lists Round's line (the call of Spin) and main's (the inlined call of Round).
  CommandResult cum = RunCommand({"/usr/bin/env", "HOME=" + dir.path(),
                                  "GOCACHE=" + dir.File("gocache"), "go", "tool", "pprof",
                                  "-top", "-cum", "-lines", "-symbolize=none", pprof_file},
                                 120);
  ASSERT_EQ(cum.exit_code, 0) << cum.output;
  std::printf("%s\n", cum.output.c_str());
  EXPECT_THAT(cum.output, HasSubstr("inline_spin.cc:29")) << cum.output;
  EXPECT_THAT(cum.output, HasSubstr("inline_spin.cc:35")) << cum.output;

  // The OTLP export too: each of Spin's sampled addresses a location whose lines are the
  // chain addr2line -i gives, innermost first, as OTLP orders a location's inlined functions.
  const std::string otlp_file = dir.File("inline.otlp");
  CommandResult otlp = RunCommand({BinPath("strata"), "--server", server.address(), "export",
                                   "--format", "otlp", "--service", "inline", "--since", "1h",
                                   "-o", otlp_file});
  ASSERT_EQ(otlp.exit_code, 0) << otlp.output;
  server::otlp::RequestBuilder::Request otlp_request;
  ASSERT_TRUE(otlp_request.ParseFromString(Slurp(otlp_file)));
  const auto& dictionary = otlp_request.dictionary();
  size_t spin_locations = 0, with_inlined = 0;
  for (const auto& location : dictionary.location_table()) {
    std::vector<Frame> chain;
    for (const auto& line : location.lines()) {
      const auto& function = dictionary.function_table(line.function_index());
      chain.emplace_back(dictionary.string_table(function.name_strindex()),
                         BaseName(dictionary.string_table(function.filename_strindex())),
                         static_cast<uint32_t>(line.line()));
    }
    if (chain.empty() || std::get<0>(chain.back()).rfind("Spin", 0) != 0 ||
        std::get<2>(chain.back()) == 0) {
      continue;  // not Spin, or Spin as a caller (Spin calls nothing that is sampled)
    }
    EXPECT_TRUE(expected.contains(chain)) << "not a chain addr2line -i gives for Spin: "
                                          << location.ShortDebugString();
    ++spin_locations;
    with_inlined += chain.size() > 1;
  }
  EXPECT_GT(spin_locations, 0u);
  EXPECT_GT(with_inlined, 0u);

  // The web UI's Lines box: flame graph frames and top rows are source lines.
  ASSERT_EQ(RunCommand({"/bin/sh", "-c", "test -x /usr/bin/chromium"}).exit_code, 0)
      << "chromium is missing: deploy/install-deps.sh installs it";
  auto web_page = [&](const std::string& query) {
    return RunCommand({"/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
                       "--no-first-run", "--disable-background-networking",
                       "--disable-component-update", "--disable-sync",
                       "--virtual-time-budget=15000", "--window-size=1280,900",
                       "--user-data-dir=" + dir.File("chromium"), "--dump-dom",
                       absl::StrCat("http://127.0.0.1:", server.http_port(), "/?", query)},
                      120);
  };
  CommandResult flame_page = web_page("service=inline&since_s=3600&lines=1");
  ASSERT_EQ(flame_page.exit_code, 0) << flame_page.output;
  EXPECT_THAT(flame_page.output, HasSubstr("data-loaded=\"flame\"")) << flame_page.output;
  EXPECT_THAT(flame_page.output,
              ::testing::ContainsRegex("<div class=\"frame\"[^>]*>Round [^<]*inline_spin.cc:29 "
                                     "\\[inlined\\]</div>"))
      << flame_page.output;
  CommandResult top_page = web_page("service=inline&since_s=3600&lines=1&view=top");
  ASSERT_EQ(top_page.exit_code, 0) << top_page.output;
  EXPECT_THAT(top_page.output,
              ::testing::ContainsRegex("<td class=\"fn\">Spin[^<]* &gt; Scale [^<]*inline_spin.cc:1[78] "
                                     "\\[inlined\\] &gt; Mix [^<]*inline_spin.cc:1[123] \\[inlined\\]</td>"))
      << top_page.output;
  // With Python/Java lines ticked too: lines from the stacks, a native leaf at its own line.
  CommandResult self_page =
      web_page("service=inline&since_s=3600&lines=1&language_self=1&view=top");
  ASSERT_EQ(self_page.exit_code, 0) << self_page.output;
  EXPECT_THAT(self_page.output, HasSubstr("Python and Java lines with the native code they call"))
      << self_page.output;
  EXPECT_THAT(self_page.output,
              ::testing::ContainsRegex(
                  "<td class=\"fn\">Spin[^<]* &gt; Scale [^<]*inline_spin.cc:1[78] \\[inlined\\] "
                  "&gt; Mix [^<]*inline_spin.cc:1[123] \\[inlined\\]</td>"))
      << self_page.output;

  // Filters that leaf addresses cannot honour are refused, not ignored.
  CommandResult focus = RunCommand({BinPath("strata"), "--server", server.address(), "top",
                                    "--by", "line", "--service", "inline", "--focus", "Mix"});
  EXPECT_NE(focus.exit_code, 0);
  EXPECT_THAT(focus.output, HasSubstr("only the time range and --host apply")) << focus.output;
}

// Production samples to a faster binary: a workload built with clang is profiled, its LLVM
// sample profile exported, merged by llvm-profdata and compiled with -fprofile-sample-use;
// the compiler takes it (entry counts and branch weights in the IR).
TEST(DebugInfoTest, LlvmSampleProfileRoundTripsThroughClang) {
  for (const char* tool : {"/usr/bin/clang", "/usr/bin/llvm-profdata"}) {
    if (access(tool, X_OK) != 0) GTEST_SKIP() << tool << " is missing (deploy/install-deps.sh)";
  }
  testing::TempDir dir("strata_e2e_fdo");
  const std::string binary = dir.File("fdo_work");
  CommandResult build = RunCommand({"/usr/bin/clang", "-O2", "-g", "-fdebug-info-for-profiling",
                                    STRATA_FDO_WORK_SOURCE, "-o", binary});
  ASSERT_EQ(build.exit_code, 0) << build.output;
  ServerProcess server(dir.File("data"), dir.File("server.log"),
                       {"--debug-dirs", dir.File("no-debug-dir")});
  ASSERT_GT(server.port(), 0) << server.process().Output();
  {
    ChildProcess work({binary}, dir.File("work.log"), {{"STRATA_SERVICE", "fdo"}});
    ASSERT_TRUE(work.WaitForOutput("ready", 30)) << work.Output();
    Profile(server, work.pid(), "fdo", 300, dir.File("agent.log"));
  }
  const std::string text = dir.File("fdo.prof.txt");
  // Without the binary's DWARF there are no lines: a clear error, no empty profile.
  CommandResult early = RunCommand({BinPath("strata"), "--server", server.address(), "export",
                                    "--service", "fdo", "--since", "1h", "--format",
                                    "llvm-sample", "-o", text});
  EXPECT_NE(early.exit_code, 0);
  EXPECT_THAT(early.output, HasSubstr("strata debuginfo upload")) << early.output;
  ASSERT_EQ(RunCommand({BinPath("strata"), "--server", server.address(), "debuginfo", "upload",
                        binary})
                .exit_code,
            0);
  CommandResult exported = RunCommand({BinPath("strata"), "--server", server.address(), "export",
                                       "--service", "fdo", "--since", "1h", "--format",
                                       "llvm-sample", "-o", text});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const std::string profile = Slurp(text);
  std::printf("%s\n", profile.substr(0, 600).c_str());
  EXPECT_THAT(profile, HasSubstr("checksum:")) << profile;

  const std::string merged = dir.File("fdo.afdo");
  CommandResult merge = RunCommand({"/usr/bin/llvm-profdata", "merge", "--sample", text, "-o",
                                    merged});
  ASSERT_EQ(merge.exit_code, 0) << merge.output;
  CommandResult show = RunCommand({"/usr/bin/llvm-profdata", "show", "--sample",
                                   "--function=checksum", merged});
  ASSERT_EQ(show.exit_code, 0) << show.output;
  EXPECT_THAT(show.output, HasSubstr("Function: checksum:")) << show.output;

  auto ir_with = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {"/usr/bin/clang", "-O2", "-g", "-fdebug-info-for-profiling",
                                     "-S", "-emit-llvm", STRATA_FDO_WORK_SOURCE, "-o", "-"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    CommandResult ir = RunCommand(argv);
    EXPECT_EQ(ir.exit_code, 0) << ir.output.substr(0, 2000);
    return ir.output;
  };
  const std::string plain = ir_with({});
  const std::string optimized = ir_with({"-fprofile-sample-use=" + merged});
  EXPECT_THAT(plain, Not(HasSubstr("function_entry_count")));
  EXPECT_THAT(optimized, HasSubstr("function_entry_count")) << optimized.substr(0, 3000);
  EXPECT_THAT(optimized, HasSubstr("branch_weights"));
  CommandResult rebuilt = RunCommand({"/usr/bin/clang", "-O2", "-fprofile-sample-use=" + merged,
                                      STRATA_FDO_WORK_SOURCE, "-o", dir.File("fdo_work_fdo")});
  EXPECT_EQ(rebuilt.exit_code, 0) << rebuilt.output;
}

}  // namespace
}  // namespace strata::e2e
