// End-to-end tests of the query surface: a data directory filled through the Store API
// with demo_service-shaped profiles, the real strata-server on loopback (gRPC and HTTP), and
// the real strata CLI. Covers flame graphs (folded, SVG, HTML, JSON), diffs of two ranges
// and of two services, pprof export checked with `go tool pprof`, error messages, the
// HTTP/JSON mirror, and the web UI in headless Chromium (screenshot kept in the build dir).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/testing/free_port.h"
#include "server/store/store.h"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kWindowMs = 10'000;

// The demo's call paths (outermost first) and their shares in the base and recent halves.
struct DemoPath {
  std::vector<std::string> frames;
  uint64_t base_per_window;
  uint64_t recent_per_window;
};
const std::vector<DemoPath>& DemoPaths() {
  static const auto* paths = new std::vector<DemoPath>{
      {{"main", "serve_forever", "handle_request", "parse_request", "tokenize"}, 60, 50},
      {{"main", "serve_forever", "handle_request", "compress_response", "deflate_block"}, 30, 40},
      {{"main", "serve_forever", "recompute_stats", "fib", "fib", "fib"}, 10, 10},
  };
  return *paths;
}

std::string Rfc3339(int64_t ms) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMillis(ms), absl::UTCTimeZone());
}

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr
};

CommandResult Shell(const std::string& command) {
  CommandResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool HaveProgram(const std::string& name) {
  return Shell(absl::StrCat("command -v ", name, " >/dev/null")).exit_code == 0;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class QueryE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One directory per process: ctest runs the cases of this suite in parallel processes,
    // each with its own store and server.
    dir_ = new fs::path(fs::path(STRATA_ARTIFACT_DIR) / absl::StrCat("query_e2e_", getpid()));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    // Whole windows, 20 minutes back: 10 base minutes, then 10 recent minutes.
    recent_to_ = (strata::base::NowMs() - 60'000) / 60'000 * 60'000;
    recent_from_ = recent_to_ - 600'000;
    base_from_ = recent_from_ - 600'000;
    Fill();
    grpc_port_ = strata::testing::FreeLoopbackPort();
    http_port_ = strata::testing::FreeLoopbackPort();
    server_pid_ = fork();
    if (server_pid_ == 0) {
      const std::string listen = absl::StrCat("127.0.0.1:", grpc_port_);
      const std::string http = absl::StrCat("127.0.0.1:", http_port_);
      const std::string data = (*dir_ / "data").string();
      const std::string log = (*dir_ / "server.log").string();
      freopen(log.c_str(), "w", stdout);
      freopen(log.c_str(), "a", stderr);
      execl(STRATA_SERVER_BIN, STRATA_SERVER_BIN, "--listen", listen.c_str(), "--http",
            http.c_str(), "--data", data.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Ready when the HTTP health check answers (a loaded machine may take a while).
    for (int i = 0; i < 300; ++i) {
      if (Http("/healthz").find("ok") != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  static void TearDownTestSuite() {
    if (server_pid_ > 0) {
      kill(server_pid_, SIGTERM);
      int status;
      waitpid(server_pid_, &status, 0);
    }
    // Kept for inspection when something failed.
    if (!::testing::UnitTest::GetInstance()->Failed()) fs::remove_all(*dir_);
    delete dir_;
  }

  // demo: base half (60/30/10 per window) then recent half (50/40/10); demo-canary: the
  // recent shape over the whole range.
  static void Fill() {
    strata::server::store::StoreOptions options;
    auto store = strata::server::store::Store::Open((*dir_ / "data").string(), options);
    ASSERT_TRUE(store.ok()) << store.status();
    strata::server::store::WriteBatch batch;
    std::vector<uint64_t> stack_ids;
    for (const DemoPath& path : DemoPaths()) {
      strata::server::store::StackFrames frames;
      for (const std::string& name : path.frames) {
        auto id = (*store)->interner().InternFunction({name, "/usr/bin/demo_service", "", name.size()},
                                           &batch);
        ASSERT_TRUE(id.ok());
        frames.function_ids.push_back(*id);
      }
      auto id = (*store)->interner().InternStack(frames, &batch);
      ASSERT_TRUE(id.ok());
      stack_ids.push_back(*id);
    }
    for (int64_t w = base_from_; w < recent_to_; w += kWindowMs) {
      for (size_t i = 0; i < stack_ids.size(); ++i) {
        const DemoPath& p = DemoPaths()[i];
        batch.AddSamples("demo", w, "host-a", stack_ids[i],
                         w < recent_from_ ? p.base_per_window : p.recent_per_window);
        batch.AddSamples("demo-canary", w, "host-b", stack_ids[i], p.recent_per_window);
      }
    }
    ASSERT_TRUE((*store)->Commit(&batch).ok());
    ASSERT_TRUE((*store)->Close().ok());
  }

  // GET over plain HTTP/1.0; returns the whole response (status line, headers, body).
  static std::string Http(const std::string& target) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(http_port_);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string response;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      const std::string request =
          absl::StrCat("GET ", target, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
      (void)!write(fd, request.data(), request.size());
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
    }
    close(fd);
    return response;
  }

  static std::string Cli(const std::string& args) {
    return absl::StrCat(STRATA_CLI_BIN, " --server 127.0.0.1:", grpc_port_, " ", args);
  }
  static std::string Range(int64_t from, int64_t to) {
    return absl::StrCat(" --from ", Rfc3339(from), " --to ", Rfc3339(to));
  }
  static std::string AllRange() { return Range(base_from_, recent_to_); }

  // function -> (self, total) from `strata top --json`.
  static std::map<std::string, std::pair<uint64_t, uint64_t>> TopOf(const std::string& filter) {
    CommandResult r = Shell(Cli(absl::StrCat("--json top -s demo -n 1000 ", filter)));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    std::map<std::string, std::pair<uint64_t, uint64_t>> out;
    std::regex row(
        R"re("function":\s*\{\s*"function":\s*"([^"]*)"[^}]*\},\s*"self":\s*"(\d+)",\s*"total":\s*"(\d+)")re");
    for (std::sregex_iterator it(r.out.begin(), r.out.end(), row), end; it != end; ++it) {
      out[(*it)[1]] = {std::stoull((*it)[2]), std::stoull((*it)[3])};
    }
    return out;
  }

  static inline fs::path* dir_ = nullptr;
  static inline int64_t base_from_ = 0, recent_from_ = 0, recent_to_ = 0;
  static inline int grpc_port_ = 0, http_port_ = 0;
  static inline pid_t server_pid_ = -1;
};

constexpr uint64_t kWindowsPerHalf = 60;

TEST_F(QueryE2eTest, TopCountsEveryWindow) {
  auto top = TopOf(AllRange());
  EXPECT_EQ(top["tokenize"].first, (60 + 50) * kWindowsPerHalf);
  EXPECT_EQ(top["deflate_block"].first, (30 + 40) * kWindowsPerHalf);
  EXPECT_EQ(top["main"].second, 200 * kWindowsPerHalf);
  // fib recurses: counted once per stack in its total.
  EXPECT_EQ(top["fib"].second, 20 * kWindowsPerHalf);
}

TEST_F(QueryE2eTest, FoldedStacksSumToTotal) {
  const fs::path out = *dir_ / "demo.folded";
  CommandResult r = Shell(Cli(absl::StrCat("flamegraph -s demo --format folded -o ", out.string(),
                                         AllRange())));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string folded = ReadFile(out);
  EXPECT_THAT(folded, HasSubstr(absl::StrCat(
                          "main;serve_forever;handle_request;parse_request;tokenize ",
                          110 * kWindowsPerHalf, "\n")));
  uint64_t sum = 0;
  for (absl::string_view line : absl::StrSplit(folded, '\n', absl::SkipEmpty())) {
    const size_t space = line.rfind(' ');
    ASSERT_NE(space, absl::string_view::npos) << line;
    uint64_t n = 0;
    ASSERT_TRUE(absl::SimpleAtoi(line.substr(space + 1), &n)) << line;
    sum += n;
  }
  EXPECT_EQ(sum, 200 * kWindowsPerHalf);
}

TEST_F(QueryE2eTest, SvgIsSelfContainedAndInteractive) {
  const fs::path out = *dir_ / "demo.svg";
  CommandResult r = Shell(Cli(absl::StrCat("flamegraph -s demo -o ", out.string(), AllRange())));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("Wrote svg flame graph of demo"));
  const std::string svg = ReadFile(out);
  EXPECT_THAT(svg, HasSubstr("<svg id=\"strata-flame\""));
  EXPECT_THAT(svg, HasSubstr("<title>tokenize (6600 samples, 55.00%)"));
  EXPECT_THAT(svg, HasSubstr("addEventListener('click'"));
  EXPECT_EQ(svg.find("http://", svg.find("xmlns") + 40), std::string::npos)
      << "no external references";
  if (HaveProgram("xmllint")) {
    CommandResult lint = Shell(absl::StrCat("xmllint --noout ", out.string()));
    EXPECT_EQ(lint.exit_code, 0) << lint.out;
  } else {
    std::printf("xmllint not installed: SVG well-formedness not checked\n");
  }
}

TEST_F(QueryE2eTest, HtmlAndJsonFlameGraphs) {
  const fs::path html = *dir_ / "demo.html";
  ASSERT_EQ(Shell(Cli(absl::StrCat("flamegraph -s demo -f html -o ", html.string(), AllRange())))
                .exit_code,
            0);
  EXPECT_THAT(ReadFile(html), HasSubstr("<!DOCTYPE html>"));
  EXPECT_THAT(ReadFile(html), HasSubstr("tokenize"));
  CommandResult json = Shell(Cli(absl::StrCat("--json flamegraph -s demo", AllRange())));
  ASSERT_EQ(json.exit_code, 0) << json.out;
  EXPECT_THAT(json.out, HasSubstr("{\"name\":\"all\",\"value\":12000,"));
  EXPECT_THAT(json.out, HasSubstr("{\"name\":\"tokenize\",\"module\":\"/usr/bin/demo_service\","
                                  "\"value\":6600,\"self\":6600,\"children\":[]}"));
}

TEST_F(QueryE2eTest, DiffOfTwoRanges) {
  // Default base: the equally long range just before.
  CommandResult r =
      Shell(Cli(absl::StrCat("diff -s demo", Range(recent_from_, recent_to_))));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("against demo (the period before, 6,000 samples)"));
  EXPECT_THAT(r.out, testing::ContainsRegex(R"(\+10\.00 +30\.0% +40\.0% .*deflate_block)"));
  EXPECT_THAT(r.out, testing::ContainsRegex(R"(-10\.00 +60\.0% +50\.0% .*tokenize)"));
  // Explicit base range, JSON.
  CommandResult j = Shell(Cli(absl::StrCat("--json diff -s demo", Range(recent_from_, recent_to_),
                                         " --base-from ", Rfc3339(base_from_), " --base-to ",
                                         Rfc3339(recent_from_ - 1000))));
  ASSERT_EQ(j.exit_code, 0) << j.out;
  EXPECT_THAT(j.out, HasSubstr("\"base_total_samples\": \"6000\""));
  EXPECT_THAT(j.out, testing::ContainsRegex(R"("function": "deflate_block"[^}]*\},\s*"base_self": "1800",\s*"self": "2400")"));
}

TEST_F(QueryE2eTest, DiffOfTwoServices) {
  CommandResult r = Shell(Cli(absl::StrCat("diff -s demo-canary --base-service demo",
                                         Range(base_from_, recent_from_))));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("against demo (the same range"));
  EXPECT_THAT(r.out, testing::ContainsRegex(R"(\+10\.00 .*deflate_block)"));
}

TEST_F(QueryE2eTest, PprofExportMatchesTop) {
  const fs::path out = *dir_ / "demo.pb.gz";
  CommandResult r =
      Shell(Cli(absl::StrCat("export -s demo --format pprof -o ", out.string(), AllRange())));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(ReadFile(out).substr(0, 2), "\x1f\x8b");
  if (!HaveProgram("go")) GTEST_SKIP() << "go is not installed (apt-get install golang-go)";
  CommandResult pprof = Shell(absl::StrCat(
      "HOME=", dir_->string(), " GOCACHE=", (*dir_ / "gocache").string(),
      " go tool pprof -top -nodefraction=0 -nodecount=1000 -symbolize=none ", out.string()));
  ASSERT_EQ(pprof.exit_code, 0) << pprof.out;
  // "      flat  flat%   sum%        cum   cum%" rows: flat, flat%, sum%, cum, cum%, name.
  std::map<std::string, std::pair<uint64_t, uint64_t>> from_pprof;
  std::regex row(R"(^\s*(\d+)\s+\S+%\s+\S+%\s+(\d+)\s+\S+%\s+(\S+)\s*$)");
  std::istringstream lines(pprof.out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_match(line, m, row)) {
      from_pprof[m[3]] = {std::stoull(m[1]), std::stoull(m[2])};
    }
  }
  auto top = TopOf(AllRange());
  ASSERT_FALSE(top.empty());
  EXPECT_EQ(from_pprof, top) << pprof.out;
}

TEST_F(QueryE2eTest, ClearErrors) {
  auto expect_error = [](const std::string& args, const std::string& message) {
    CommandResult r = Shell(Cli(args));
    // 1 for what the server refuses; a flag whose value is malformed is a usage error
    // (CLI11's exit status for a failed check, 105).
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 105) << args << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(message)) << args;
  };
  expect_error("flamegraph -s nope -f folded", "unknown service 'nope' (known: demo, demo-canary)");
  expect_error("top -s demo --focus '(('", "invalid --focus regex '(('");
  expect_error("diff -s demo --ignore '[z-a]'", "invalid --ignore regex");
  expect_error("flamegraph -s demo --from 2030-01-01T00:00:00Z --to 2029-01-01T00:00:00Z",
               "--from must be before --to");
  expect_error("export -s demo -o /tmp/x.pb.gz --since 10parsecs", "--since");
  expect_error("diff -s demo --since 1h --base-since 30m", "must reach further back");
  expect_error("diff -s demo --base-service nope", "base: unknown service 'nope'");
}

TEST_F(QueryE2eTest, HttpMirror) {
  const std::string range = absl::StrCat("from_ms=", base_from_, "&to_ms=", recent_to_);
  const std::string q = absl::StrCat("service=demo&", range);
  std::string svg = Http(absl::StrCat("/api/v1/flamegraph?format=svg&", q));
  EXPECT_THAT(svg, HasSubstr("Content-Type: image/svg+xml"));
  EXPECT_THAT(svg, HasSubstr("tokenize"));
  EXPECT_THAT(Http(absl::StrCat("/api/v1/flamegraph?format=folded&", q)),
              HasSubstr("main;serve_forever;handle_request;parse_request;tokenize 6600"));
  EXPECT_THAT(Http(absl::StrCat("/api/v1/flamegraph?format=bogus&", q)),
              HasSubstr("400 Bad Request"));
  // Lines where the server has DWARF; these modules have none, so frames stay functions.
  EXPECT_THAT(Http(absl::StrCat("/api/v1/flamegraph?format=folded&lines=1&", q)),
              HasSubstr("main;serve_forever;handle_request;parse_request;tokenize 6600"));
  EXPECT_THAT(Http(absl::StrCat("/api/v1/flamegraph?lines=maybe&", q)),
              HasSubstr("lines must be 1, true, 0 or false"));
  EXPECT_THAT(Http(absl::StrCat("/api/v1/top?by=line&", q)), HasSubstr("\"total_samples\""));
  EXPECT_THAT(Http(absl::StrCat("/api/v1/top?by=file&", q)), HasSubstr("unknown by 'file'"));
  EXPECT_THAT(Http(absl::StrCat("/api/v1/diff?service=demo-canary&base_service=demo&", range)),
              HasSubstr("\"base_total_samples\":\"12000\""));
  EXPECT_THAT(Http(absl::StrCat("/api/v1/top?service=demo&focus=((")),
              HasSubstr("invalid --focus regex"));
  std::string pprof = Http(absl::StrCat("/api/v1/export?", q));
  EXPECT_THAT(pprof, HasSubstr("\r\n\r\n\x1f\x8b"));
  EXPECT_THAT(Http("/"), HasSubstr("<title>Strata</title>"));
  EXPECT_THAT(Http("/ui/app.js"), HasSubstr("/api/v1/flamegraph"));
  EXPECT_THAT(Http("/ui/timeline.js"), HasSubstr("/api/v1/series"));
}

TEST_F(QueryE2eTest, WebUiShowsTheHottestFrame) {
  if (!HaveProgram("chromium")) {
    GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
  }
  const fs::path profile = *dir_ / "chromium-profile";
  const fs::path shot = fs::path(STRATA_ARTIFACT_DIR) / "query_web_ui.png";
  fs::remove(shot);
  const std::string flags = absl::StrCat(
      "chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
      "--disable-background-networking --disable-component-update --disable-sync "
      "--virtual-time-budget=15000 --window-size=1280,900 --user-data-dir=",
      profile.string());
  const std::string url =
      absl::StrCat("'http://127.0.0.1:", http_port_, "/?service=demo&since_s=3600'");
  CommandResult dom = Shell(absl::StrCat(flags, " --dump-dom ", url));
  ASSERT_EQ(dom.exit_code, 0) << dom.out;
  EXPECT_THAT(dom.out, HasSubstr("data-loaded=\"flame\""));
  EXPECT_THAT(dom.out, testing::ContainsRegex("<div class=\"frame\"[^>]*>tokenize</div>"));
  EXPECT_THAT(dom.out, HasSubstr("<option value=\"demo-canary\">demo-canary</option>"));
  // The widest leaf is tokenize: 55 % of the graph's width.
  std::smatch m;
  std::regex tokenize(R"(width: ([0-9.]+)px;[^>]*>tokenize<)");
  std::regex root(R"(width: ([0-9.]+)px;[^>]*>all<)");
  ASSERT_TRUE(std::regex_search(dom.out, m, tokenize)) << dom.out;
  const double tokenize_px = std::stod(m[1]);
  ASSERT_TRUE(std::regex_search(dom.out, m, root));
  EXPECT_NEAR(tokenize_px / std::stod(m[1]), 0.55, 0.01);

  CommandResult top = Shell(absl::StrCat(flags, " --dump-dom ",
                                       absl::StrCat("'http://127.0.0.1:", http_port_,
                                                    "/?service=demo&view=top'")));
  EXPECT_THAT(top.out, HasSubstr("<td class=\"fn\">tokenize</td>"));

  CommandResult s = Shell(absl::StrCat(flags, " --screenshot=", shot.string(), " ", url));
  ASSERT_EQ(s.exit_code, 0) << s.out;
  ASSERT_TRUE(fs::exists(shot)) << s.out;
  EXPECT_GT(fs::file_size(shot), 10'000u);
  std::printf("web UI screenshot: %s\n", shot.c_str());
}

}  // namespace
