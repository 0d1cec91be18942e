// The attach protocol against a live HotSpot JVM (Debian's OpenJDK; skipped without one):
// diagnostic commands answered, Compiler.perfmap writing the JVM's perf map, refusals and
// processes that are no JVM reported as such without harming them.
#include "agent/jvm/hotspot_attach.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/jvm/hotspot_methods.h"
#include "agent/jvm/hotspot_scopes.h"
#include "agent/jvm/hotspot_tables.h"
#include "agent/symbols/module_cache.h"
#include "agent/symbols/process_address_space.h"
#include "gtest/gtest.h"

namespace strata::agent::jvm {
namespace {

constexpr char kJava[] = "/usr/bin/java";

// A child process, killed and reaped at scope exit.
class Child {
 public:
  explicit Child(std::vector<std::string> argv) {
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      // A killed JVM leaves its attach socket behind.
      std::filesystem::remove(absl::StrCat("/tmp/.java_pid", pid_));
    }
  }
  pid_t pid() const { return pid_; }
  bool running() const {
    int status = 0;
    return waitpid(pid_, &status, WNOHANG) == 0;
  }

 private:
  pid_t pid_ = -1;
};

// A JVM running a one-file program (no javac needed) that loops until killed.
std::unique_ptr<Child> StartJvm(const std::string& dir) {
  const std::string source = dir + "/Idle.java";
  std::ofstream(source) << "public class Idle { public static void main(String[] a) throws "
                           "Exception { while (true) Thread.sleep(50); } }\n";
  return std::make_unique<Child>(
      std::vector<std::string>{kJava, "-XX:TieredStopAtLevel=1", source});
}

// Asks until the JVM's signal handlers are installed (it refuses to be signalled before).
absl::StatusOr<std::string> RunWhenReady(pid_t pid, std::string_view command) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  absl::StatusOr<std::string> answer;
  do {
    answer = RunDiagnosticCommand(pid, command, absl::Seconds(10));
    if (answer.ok() || !absl::IsDeadlineExceeded(answer.status())) return answer;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  return answer;
}

class HotSpotAttachTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kJava)) GTEST_SKIP() << kJava << " is not installed";
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("strata_jvm_", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
};

TEST_F(HotSpotAttachTest, RunsCommandsAndWritesThePerfMap) {
  std::unique_ptr<Child> jvm = StartJvm(dir_);
  absl::StatusOr<std::string> version = RunWhenReady(jvm->pid(), "VM.version");
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_NE(version->find("JDK"), std::string::npos) << *version;
  // The listener is up now: the next command goes straight to its socket.
  const std::string map = absl::StrCat("/tmp/perf-", jvm->pid(), ".map");
  std::filesystem::remove(map);
  absl::StatusOr<std::string> perfmap = RunDiagnosticCommand(jvm->pid(), "Compiler.perfmap",
                                                             absl::Seconds(10));
  ASSERT_TRUE(perfmap.ok()) << perfmap.status();
  std::ifstream in(map);
  ASSERT_TRUE(in.good()) << map << " not written";
  std::string line;
  size_t lines = 0;
  while (std::getline(in, line)) ++lines;
  EXPECT_GT(lines, 10u) << "the code cache holds at least the interpreter's stubs";
  std::filesystem::remove(map);
  // No attach trigger left behind in the JVM's working directory (this test's: it forked the
  // JVM) or its /tmp.
  const std::string trigger = absl::StrCat(".attach_pid", jvm->pid());
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::current_path() / trigger));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path("/tmp") / trigger));
  EXPECT_TRUE(jvm->running());

  absl::StatusOr<std::string> unknown =
      RunDiagnosticCommand(jvm->pid(), "No.such_command", absl::Seconds(10));
  EXPECT_TRUE(absl::IsFailedPrecondition(unknown.status())) << unknown.status();
  EXPECT_TRUE(jvm->running());

  // The offsets interpreted frames are named through, from the running JVM's own tables.
  symbols::ModuleCache cache;
  symbols::ProcessAddressSpace space(jvm->pid(), &cache);
  ASSERT_TRUE(space.Refresh().ok());
  absl::StatusOr<HotSpotOffsets> offsets = absl::NotFoundError("no libjvm.so mapped");
  absl::StatusOr<HotSpotCodeLayout> layout = absl::NotFoundError("no libjvm.so mapped");
  space.ForEachModule([&](const symbols::Module& m, int64_t bias) {
    if (m.elf != nullptr && m.path.ends_with("/libjvm.so")) {
      const python::RemoteMemory memory(jvm->pid());
      offsets = ReadHotSpotOffsets(*m.elf, bias, memory);
      absl::StatusOr<HotSpotTables> tables = HotSpotTables::Read(*m.elf, bias, memory);
      layout = tables.ok() ? CodeLayout(*tables, memory) : tables.status();
    }
  });
  // And where its compiled code's scopes are (JDK 17: within the nmethod, integers without
  // an excess).
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_FALSE(layout->out_of_line);
  EXPECT_EQ(layout->excess, 0u);
  EXPECT_EQ(layout->pc_desc_size, 16u);
  ASSERT_TRUE(offsets.ok()) << offsets.status();
  EXPECT_GT(offsets->method_const_method, 0u);
  EXPECT_NE(offsets->const_method_name_index, offsets->const_method_signature_index);
  EXPECT_GT(offsets->symbol_body, offsets->symbol_length);
  EXPECT_GE(offsets->constant_pool_size, 32u);
  EXPECT_LE(offsets->constant_pool_size, 256u);
}

// Until `pid` runs `program` (its exec done: under qemu the child runs as the emulator until
// then), at most 30 s.
bool WaitForExec(pid_t pid, const std::string& program) {
  const std::filesystem::path want = std::filesystem::canonical(program);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    std::error_code ec;
    if (std::filesystem::read_symlink(absl::StrCat("/proc/", pid, "/exe"), ec) == want) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// Until `child` has a SIGQUIT handler (SigCgt shows it), at most 60 s.
bool WaitForSigquitHandler(const Child& child) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && child.running()) {
    std::ifstream status(absl::StrCat("/proc/", child.pid(), "/status"));
    std::string line;
    while (std::getline(status, line)) {
      uint64_t mask = 0;
      if (line.starts_with("SigCgt:") &&
          absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line.substr(7)), &mask) &&
          ((mask >> (SIGQUIT - 1)) & 1)) {
        return true;
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// What a JVM killed without cleanup leaves in /tmp: a socket file nobody listens on. Pids are
// reused, so the next process with that pid finds it.
void LeaveStaleAttachSocket(pid_t pid) {
  const std::string path = absl::StrCat("/tmp/.java_pid", pid);
  std::filesystem::remove(path);
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0)
      << std::strerror(errno);
  close(fd);
}

// A JVM whose pid names a dead JVM's socket: the stale file is passed over, the listener this
// JVM starts replaces it.
TEST_F(HotSpotAttachTest, AJvmBehindAStaleSocketIsStillReached) {
  std::unique_ptr<Child> jvm = StartJvm(dir_);
  ASSERT_TRUE(WaitForExec(jvm->pid(), kJava));
  ASSERT_TRUE(WaitForSigquitHandler(*jvm)) << "the JVM never installed its handlers";
  LeaveStaleAttachSocket(jvm->pid());
  absl::StatusOr<std::string> version = RunWhenReady(jvm->pid(), "VM.version");
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_NE(version->find("JDK"), std::string::npos) << *version;
  EXPECT_TRUE(jvm->running());
}

TEST_F(HotSpotAttachTest, ProcessesThatAreNoJvmAreLeftAlone) {
  // sleep(1) has no SIGQUIT handler: it must not be signalled (SIGQUIT would end it).
  Child sleeper({"/bin/sleep", "60"});
  ASSERT_TRUE(WaitForExec(sleeper.pid(), "/bin/sleep"));
  absl::StatusOr<std::string> answer =
      RunDiagnosticCommand(sleeper.pid(), "VM.version", absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(answer.status())) << answer.status();
  EXPECT_TRUE(sleeper.running());
  // Nor when a dead JVM of the same pid left its socket behind.
  LeaveStaleAttachSocket(sleeper.pid());
  answer = RunDiagnosticCommand(sleeper.pid(), "VM.version", absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(answer.status())) << answer.status();
  EXPECT_NE(answer.status().message().find("libjvm.so"), std::string::npos) << answer.status();
  EXPECT_TRUE(sleeper.running());
  EXPECT_TRUE(absl::IsNotFound(
      RunDiagnosticCommand(999999999, "VM.version", absl::Seconds(1)).status()));
  // A process that catches SIGQUIT but is no JVM (a Go program would dump its goroutines
  // and exit): not signalled either.
  if (std::filesystem::exists("/usr/bin/python3")) {
    Child catcher({"/usr/bin/python3", "-c",
                   "import signal, sys, time\n"
                   "signal.signal(signal.SIGQUIT, lambda *a: sys.exit(3))\n"
                   "time.sleep(60)\n"});
    ASSERT_TRUE(WaitForExec(catcher.pid(), "/usr/bin/python3"));
    ASSERT_TRUE(WaitForSigquitHandler(catcher)) << "python3 never installed its handler";
    answer = RunDiagnosticCommand(catcher.pid(), "VM.version", absl::Seconds(1));
    EXPECT_TRUE(absl::IsDeadlineExceeded(answer.status())) << answer.status();
    EXPECT_NE(answer.status().message().find("libjvm.so"), std::string::npos) << answer.status();
    EXPECT_TRUE(catcher.running());
  }
}

// Writes `chunk` to `fd` every `pause` until the peer closes its end.
void SendUntilClosed(int fd, std::string chunk, absl::Duration pause) {
  while (::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL) > 0) absl::SleepFor(pause);
}

TEST(AttachAnswerTest, AnAnswerWithoutEndIsCutAtTheCap) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  std::thread sender(SendUntilClosed, fds[1], std::string(65536, 'x'), absl::ZeroDuration());
  absl::StatusOr<std::string> answer =
      ReadAttachAnswer(fds[0], absl::Now() + absl::Seconds(60), size_t{1} << 20);
  ::close(fds[0]);
  sender.join();
  ::close(fds[1]);
  EXPECT_TRUE(absl::IsResourceExhausted(answer.status())) << answer.status();
}

TEST(AttachAnswerTest, AnAnswerTrickledByteByByteIsCutAtTheDeadline) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  std::thread sender(SendUntilClosed, fds[1], std::string("0"), absl::Milliseconds(5));
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> answer =
      ReadAttachAnswer(fds[0], start + absl::Milliseconds(300), size_t{1} << 20);
  const absl::Duration took = absl::Now() - start;
  ::close(fds[0]);
  sender.join();
  ::close(fds[1]);
  EXPECT_TRUE(absl::IsDeadlineExceeded(answer.status())) << answer.status();
  EXPECT_LT(took, absl::Seconds(30));
}

TEST(AttachAnswerTest, AnAnswerThatEndsIsReadWhole) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const std::string sent = "0\n" + std::string(100000, 'v');
  std::thread sender([&] {
    ::send(fds[1], sent.data(), sent.size(), MSG_NOSIGNAL);
    ::close(fds[1]);
  });
  absl::StatusOr<std::string> answer =
      ReadAttachAnswer(fds[0], absl::Now() + absl::Seconds(60), sent.size());
  sender.join();
  ::close(fds[0]);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(*answer, sent);
}

// A process that looks like a JVM to the agent (it maps a file named libjvm.so and serves the
// attach socket) answering without end: the command fails at the cap, it does not read on.
TEST(AttachAnswerTest, ATargetAnsweringWithoutEndIsRefused) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("strata_fake_jvm_", getpid());
  std::filesystem::create_directories(dir);
  const std::string lib = (dir / "libjvm.so").string();
  std::ofstream(lib) << std::string(4096, '\0');
  const int lib_fd = ::open(lib.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(lib_fd, 0);
  void* mapped = ::mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE, lib_fd, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  const std::string socket_path = absl::StrCat("/tmp/.java_pid", getpid());
  std::filesystem::remove(socket_path);
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, socket_path.data(), socket_path.size());
  ASSERT_EQ(::bind(listener, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  std::thread jvm([listener] {
    const int peer = ::accept(listener, nullptr, nullptr);
    if (peer < 0) return;
    SendUntilClosed(peer, "0\n" + std::string(65536, 'x'), absl::ZeroDuration());
    ::close(peer);
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> answer = RunDiagnosticCommand(getpid(), "VM.version",
                                                            absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  jvm.join();
  ::close(listener);
  std::filesystem::remove(socket_path);
  ::munmap(mapped, 4096);
  ::close(lib_fd);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(absl::IsResourceExhausted(answer.status())) << answer.status();
  EXPECT_NE(answer.status().message().find(socket_path), std::string::npos) << answer.status();
  EXPECT_LT(took, absl::Seconds(9));  // under the command's 10 s: cut by size, not time
}

}  // namespace
}  // namespace strata::agent::jvm
