// HotSpot JIT code end to end: a JVM started without any profiling option runs a hot method;
// the real strata-agent, told to (--jvm-perf-map), asks it for perf maps through the attach
// mechanism while it runs, and the real strata-server's hot paths name the method's compiled
// code, in whole stacks although compiled Java code keeps no frame pointer, called from a
// method the JVM only ever interprets, named as that method, and with the calls the JIT inlined
// into it (read from the compiled code's debug information) as frames of their own, each at
// its source file and line. The JVM is not disturbed: it keeps running and prints no thread
// dump.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

// The JVMs profiled: Debian's OpenJDK 17 (or the JDK under $STRATA_JAVA_HOME, by hand), and
// Debian's OpenJDK 21 and 25, unpacked into the build with their own C library by
// deploy/cross/make-jdk-root.sh. The test's program is compiled by the host's javac.
struct Jdk {
  std::string home;     // its bin/java runs the JVM
  const char* missing;  // what to do where it is not there
};

Jdk JdkOf(const std::string& name) {
  if (name == "openjdk21" || name == "openjdk25") {
    return {absl::StrCat(STRATA_JDK_ROOT, "/", name.substr(7)),
            "deploy/cross/make-jdk-root.sh " STRATA_JDK_ROOT};
  }
  const char* home = std::getenv("STRATA_JAVA_HOME");
  return {home != nullptr && *home != '\0' ? home : "/usr", "Debian package default-jdk-headless"};
}

// The name HotSpot's perf map gives the method's compiled code.
constexpr char kHotMethod[] = "long Spin.hotLoop(long)";
// Its caller, never compiled (-XX:CompileCommand=exclude): always the interpreter's frame.
constexpr char kInterpretedCaller[] = "long Spin.viaInterpreter(long)";
// Inlined into the hot method: a frame only the compiled code's debug information knows.
constexpr char kInlined[] = "long Spin.mixTwice(long, long)";
// Called by the inlined method, never inlined itself (-XX:CompileCommand=dontinline).
constexpr char kOutOfLine[] = "long Spin.mix(long, long)";
// A loop never compiled either: samples in it are interpreted leaves, at line 12.
constexpr char kInterpretedLeaf[] = "long Spin.interpretedLoop(long)";

constexpr char kSource[] = R"(public class Spin {
  static long mix(long s, long i) { return (s * 31 + i) % 1000003; }
  static long mixTwice(long s, long i) { return mix(mix(s, i), i + 1); }
  static long hotLoop(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s = mixTwice(s, i);
    return s;
  }
  static long viaInterpreter(long n) { return hotLoop(n); }
  static long interpretedLoop(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s = (s * 17 + i) % 1000033;
    return s;
  }
  public static void main(String[] args) {
    long sink = 0;
    System.out.println("ready");
    final long stopAt = System.currentTimeMillis() + 300_000;
    while (System.currentTimeMillis() < stopAt) {
      sink += viaInterpreter(2_000_000);
      sink += interpretedLoop(100_000);
    }
    System.out.println("done " + sink);
  }
}
)";

// Samples of `paths` with a frame named `name`, and of JIT frames left unnamed.
struct Counts {
  uint64_t named = 0, unnamed = 0, total = 0;
  // Of the named ones: complete stacks, those whose frame calling `name` is its interpreted
  // caller, named, and those with a frame left as the interpreter's code.
  uint64_t complete = 0, called_from_java = 0, interpreter = 0;
  // Samples in the out-of-line method, and those of them called from the inlined method
  // called from the named one.
  uint64_t out_of_line = 0, through_inlined = 0;
  std::string module;  // of the named frame
};

// The samples of `folded` ("a;b;c 123" lines) whose stack holds `frames` one after the other.
uint64_t FoldedSamples(const std::string& folded, const std::vector<std::string>& frames) {
  const std::string chain = absl::StrJoin(frames, ";");
  uint64_t n = 0;
  for (absl::string_view line : absl::StrSplit(folded, '\n', absl::SkipEmpty())) {
    const size_t space = line.rfind(' ');
    uint64_t count = 0;
    if (space == absl::string_view::npos || !absl::SimpleAtoi(line.substr(space + 1), &count)) {
      continue;
    }
    const absl::string_view stack = line.substr(0, space);
    const size_t at = stack.find(chain);
    if (at != absl::string_view::npos && (at == 0 || stack[at - 1] == ';')) n += count;
  }
  return n;
}

Counts CountFrames(const v1::HotPathsResponse& paths, const std::string& name) {
  Counts c;
  c.total = paths.total_samples();
  for (const v1::HotPath& p : paths.paths()) {
    bool named = false, unnamed = false, from_java = false, interpreter = false;
    bool out_of_line = false, through_inlined = false;
    for (int i = 0; i < p.frames_size(); ++i) {
      const v1::Frame& f = p.frames(i);
      if (f.function() == kOutOfLine) {
        out_of_line = true;
        through_inlined |= i >= 2 && p.frames(i - 1).function() == kInlined &&
                           p.frames(i - 2).function() == name;
      }
      if (f.function() == name) {
        named = true;
        c.module = f.module();
        from_java = i > 0 && p.frames(i - 1).function() == kInterpretedCaller;
      }
      interpreter |= f.function() == "Interpreter";
      unnamed |= f.function().starts_with("[jit]+0x");
    }
    c.named += named ? p.samples() : 0;
    c.complete += named && !p.truncated() ? p.samples() : 0;
    c.called_from_java += named && from_java ? p.samples() : 0;
    c.interpreter += named && interpreter ? p.samples() : 0;
    c.unnamed += unnamed ? p.samples() : 0;
    c.out_of_line += out_of_line ? p.samples() : 0;
    c.through_inlined += through_inlined ? p.samples() : 0;
  }
  return c;
}

class JvmE2eTest : public ::testing::TestWithParam<std::string> {};

TEST_P(JvmE2eTest, HotSpotJitCodeIsNamedWithoutARestart) {
  const Jdk jdk = JdkOf(GetParam());
  const std::string java_tool = jdk.home + "/bin/java";
  std::string javac_tool = jdk.home + "/bin/javac";
  if (!std::filesystem::exists(javac_tool)) javac_tool = "/usr/bin/javac";
  if (!std::filesystem::exists(java_tool) || !std::filesystem::exists(javac_tool)) {
    GTEST_SKIP() << "no " << java_tool << " or " << javac_tool << " (" << jdk.missing << ")";
  }
  strata::testing::TempDir dir("strata_jvm_e2e");
  std::ofstream(dir.File("Spin.java")) << kSource;
  CommandResult javac = RunCommand({javac_tool, "-d", dir.path(), dir.File("Spin.java")}, 120);
  ASSERT_EQ(javac.exit_code, 0) << javac.output;

  ServerProcess server(dir.File("data"), dir.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  const std::string service = absl::StrCat("jvm-", getpid());
  ChildProcess java({java_tool, "-XX:CompileCommand=quiet",
                     "-XX:CompileCommand=exclude,Spin::viaInterpreter",
                     "-XX:CompileCommand=exclude,Spin::interpretedLoop",
                     "-XX:CompileCommand=dontinline,Spin::mix", "-cp", dir.path(), "Spin"},
                    dir.File("java.log"),
                    {{"STRATA_SERVICE", service}});
  // The JVM writes its map and its attach socket into its own /tmp, and is killed: remove
  // both whatever happens.
  struct Unlink {
    std::string path;
    ~Unlink() { std::remove(path.c_str()); }
  } unlink_map{absl::StrCat("/tmp/perf-", java.pid(), ".map")},
      unlink_socket{absl::StrCat("/tmp/.java_pid", java.pid())};
  ASSERT_TRUE(java.WaitForOutput("ready", 60)) << java.Output();

  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(java.pid()), "--interval", "1", "--jvm-perf-map", service,
                      "--spool-dir", "none"},
                     dir.File("agent.log"));
  ASSERT_TRUE(agent.WaitForOutput("JIT code named from its JVM's perf map", 90))
      << agent.Output();
  // The method's code named in 200 samples (2 s of its thread's CPU at 99 Hz); at most 150 s
  // on a loaded machine.
  Counts counts;
  const absl::Time deadline = absl::Now() + absl::Seconds(150);
  while (absl::Now() < deadline && java.running() && agent.running()) {
    // The map can be named before the first batch is stored: until then the service is
    // unknown to queries.
    if (ServiceTotal(server.address(), service) == 0) {
      absl::SleepFor(absl::Milliseconds(200));
      continue;
    }
    counts = CountFrames(QueryHotPaths(server.address(), service), kHotMethod);
    if (counts.named >= 200) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_TRUE(java.running()) << java.Output();
  EXPECT_EQ(agent.Stop(SIGTERM, 30), 0) << agent.Output();
  java.Stop(SIGKILL);

  v1::HotPathsResponse paths = QueryHotPaths(server.address(), service);
  counts = CountFrames(paths, kHotMethod);
  std::string top;
  for (int i = 0; i < std::min(paths.paths_size(), 8); ++i) {
    absl::StrAppend(&top, paths.paths(i).samples(), ": ",
                    absl::StrJoin(FrameNames(paths.paths(i)), " > "), "\n");
  }
  std::fprintf(stderr, "%lu of %lu samples in %s (%s), %lu with unnamed JIT frames\n%s",
               static_cast<unsigned long>(counts.named), static_cast<unsigned long>(counts.total),
               kHotMethod, counts.module.c_str(), static_cast<unsigned long>(counts.unnamed),
               top.c_str());
  EXPECT_GE(counts.named, 200u) << top << agent.Output();
  // A Java method, at its class's source file: the package's path (none here) and SourceFile.
  EXPECT_EQ(counts.module, "[java:Spin.java]");
  // Compiled without a frame pointer (no -XX:+PreserveFramePointer), the method's frame is
  // left by its entry code's layout, out to its Java caller and the thread's start.
  // Its caller, interpreted, is named as the Java method it is (its Method* in its frame).
  std::fprintf(stderr,
               "of those %lu complete, %lu called from %s, %lu with an interpreter frame\n",
               static_cast<unsigned long>(counts.complete),
               static_cast<unsigned long>(counts.called_from_java), kInterpretedCaller,
               static_cast<unsigned long>(counts.interpreter));
  EXPECT_GE(counts.complete * 10, counts.named * 9) << top;
  EXPECT_GE(counts.called_from_java * 10, counts.named * 9) << top;
  EXPECT_LE(counts.interpreter * 10, counts.named) << top;
  // The frames compiled code inlined are there, named from the code's scopes: the method
  // called from the inlined one is called from it, inside the hot method.
  std::fprintf(stderr, "%lu samples in %s, %lu of them under %s > %s\n",
               static_cast<unsigned long>(counts.out_of_line), kOutOfLine,
               static_cast<unsigned long>(counts.through_inlined), kHotMethod, kInlined);
  EXPECT_GE(counts.out_of_line, 50u) << top;
  EXPECT_GE(counts.through_inlined * 10, counts.out_of_line * 9) << top;
  // Each frame at its line: the interpreted caller at its call (its frame's bytecode
  // pointer), the compiled method and the one inlined into it at theirs (the return address's
  // scopes), the sampled leaf in its one line (the next scope after its pc). Lines of kSource.
  grpc::ClientContext context;
  v1::FlameGraphRequest request;
  request.mutable_filter()->set_service(service);
  request.set_format(v1::FlameGraphRequest::FOLDED);
  request.set_lines(true);
  v1::FlameGraphResponse flame;
  ASSERT_TRUE(v1::Query::NewStub(server.Channel())->FlameGraph(&context, request, &flame).ok());
  const std::string folded = flame.rendered();
  auto at = [](const char* method, int line) {
    return absl::StrCat(method, " Spin.java:", line, "_[j]");
  };
  const uint64_t in_leaf = FoldedSamples(folded, {at(kOutOfLine, 2)});
  const uint64_t whole_chain =
      FoldedSamples(folded, {at(kInterpretedCaller, 9), at(kHotMethod, 6), at(kInlined, 3),
                             at(kOutOfLine, 2)});
  std::fprintf(stderr, "%lu samples in %s at line 2, %lu of them under lines 9 > 6 > 3\n",
               static_cast<unsigned long>(in_leaf), kOutOfLine,
               static_cast<unsigned long>(whole_chain));
  EXPECT_GE(in_leaf * 10, counts.out_of_line * 9) << folded.substr(0, 4000);
  EXPECT_GE(whole_chain * 10, in_leaf * 8) << folded.substr(0, 4000);
  // An interpreted leaf at its line, from the sampled bytecode pointer (r13): the loop's.
  const uint64_t interpreted = FoldedSamples(folded, {kInterpretedLeaf});
  const uint64_t interpreted_at_loop = FoldedSamples(folded, {at(kInterpretedLeaf, 12)});
  std::fprintf(stderr, "%lu samples in %s, %lu of them at line 12\n",
               static_cast<unsigned long>(interpreted), kInterpretedLeaf,
               static_cast<unsigned long>(interpreted_at_loop));
  EXPECT_GE(interpreted, 5u) << folded.substr(0, 4000);
  EXPECT_GE(interpreted_at_loop * 10, interpreted * 8) << folded.substr(0, 4000);
  // Asked through the attach listener, not by a SIGQUIT the JVM took as a dump request.
  EXPECT_EQ(java.Output().find("Full thread dump"), std::string::npos) << java.Output();
}

INSTANTIATE_TEST_SUITE_P(Jdks, JvmE2eTest,
                         ::testing::Values("openjdk17", "openjdk21", "openjdk25"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace strata::e2e
