#include "agent/jvm/hotspot_attach.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "agent/procfs/procfs.h"

namespace strata::agent::jvm {
namespace {

// How long one command may run once connected: Compiler.perfmap walks the whole code cache
// at a safepoint, tens of milliseconds for a large service.
constexpr absl::Duration kCommandTimeout = absl::Seconds(10);

// The longest answer taken: the commands asked for answer in a few hundred bytes, and what
// listens on the socket is the target's, so its answer is not trusted to end.
constexpr size_t kMaxAnswerBytes = size_t{1} << 20;

bool IsSocket(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

// Whether `pid` runs HotSpot: it maps libjvm.so. Only such a process is ever sent SIGQUIT;
// many others catch it with other meanings (a Go program dumps its goroutines and exits), and
// a process between fork and exec still carries its parent's handlers.
absl::StatusOr<bool> MapsLibjvm(pid_t pid) {
  absl::StatusOr<std::string> maps = procfs::ReadProcFile(absl::StrCat("/proc/", pid, "/maps"));
  if (!maps.ok()) return maps.status();
  for (const procfs::Mapping& m : procfs::ParseMaps(*maps)) {
    if (IsLibJvm(m.path)) return true;
  }
  return false;
}

// Whether `pid` has a handler for SIGQUIT. A JVM run with -Xrs, or one still starting, has
// none: SIGQUIT would end it with a core dump instead of starting its attach listener.
absl::StatusOr<bool> CatchesSigquit(pid_t pid) {
  absl::StatusOr<std::string> status =
      procfs::ReadProcFile(absl::StrCat("/proc/", pid, "/status"));
  if (!status.ok()) return status.status();
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    if (!absl::ConsumePrefix(&line, "SigCgt:")) continue;
    uint64_t mask = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line), &mask)) break;
    return (mask & (uint64_t{1} << (SIGQUIT - 1))) != 0;
  }
  return absl::InternalError(absl::StrCat("pid ", pid, ": no SigCgt in its status"));
}

// The file whose presence makes the JVM start its attach listener on SIGQUIT: in its working
// directory, else in its /tmp (HotSpot looks in both).
absl::StatusOr<std::string> CreateTrigger(pid_t pid, pid_t ns_pid) {
  const std::string name = absl::StrCat("/.attach_pid", ns_pid);
  for (const std::string& dir :
       {absl::StrCat("/proc/", pid, "/cwd"), absl::StrCat("/proc/", pid, "/root/tmp")}) {
    const std::string path = dir + name;
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
      return path;
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("pid ", pid, ": cannot create ", name.substr(1),
                   " in its working directory or /tmp: ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("write: ", std::strerror(errno)));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Sends `request` to the listener at `socket_path` and returns its whole answer. `*connected`
// (when given) tells whether anyone listened: a socket that refuses connections is a stale file.
absl::StatusOr<std::string> Exchange(const std::string& socket_path, std::string_view request,
                                     bool* connected = nullptr) {
  if (connected != nullptr) *connected = false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", socket_path));
  }
  std::memcpy(address.sun_path, socket_path.data(), socket_path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  // Writes time out; the answer's read has its own deadline (ReadAttachAnswer).
  const timeval limit{static_cast<time_t>(absl::ToInt64Seconds(kCommandTimeout)), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  absl::StatusOr<std::string> response = std::string();
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    response = absl::UnavailableError(
        absl::StrCat("connecting to ", socket_path, ": ", std::strerror(errno)));
    ::close(fd);
    return response;
  }
  if (connected != nullptr) *connected = true;
  if (absl::Status written = WriteAll(fd, request); !written.ok()) {
    response = written;
  } else {
    response = ReadAttachAnswer(fd, absl::Now() + kCommandTimeout, kMaxAnswerBytes);
    if (!response.ok()) {
      response = absl::Status(response.status().code(),
                              absl::StrCat(socket_path, ": ", response.status().message()));
    }
  }
  ::close(fd);
  return response;
}

}  // namespace

absl::StatusOr<std::string> ReadAttachAnswer(int fd, absl::Time deadline, size_t max_bytes) {
  std::string answer;
  char buffer[16384];
  while (true) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd readable{fd, POLLIN, 0};
    const int ready = left_ms <= 0 ? 0 : ::poll(&readable, 1, static_cast<int>(left_ms));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      return absl::InternalError(absl::StrCat("waiting for the answer: ", std::strerror(errno)));
    }
    if (ready == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no end to the answer in time (", answer.size(), " bytes so far)"));
    }
    const ssize_t n = ::read(fd, buffer, std::min(sizeof(buffer), max_bytes + 1 - answer.size()));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      return absl::UnavailableError(absl::StrCat("reading the answer: ", std::strerror(errno)));
    }
    if (n == 0) return answer;
    answer.append(buffer, static_cast<size_t>(n));
    if (answer.size() > max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the answer is longer than ", max_bytes, " bytes"));
    }
  }
}

std::string EncodeAttachRequest(std::string_view command, std::string_view argument) {
  std::string request("1", 2);  // protocol version 1, NUL-terminated
  request.append(command).push_back('\0');
  request.append(argument).push_back('\0');
  request.append(2, '\0');  // two empty arguments
  return request;
}

absl::StatusOr<std::string> ParseAttachResponse(std::string_view response) {
  const size_t newline = response.find('\n');
  int code = 0;
  if (newline == std::string_view::npos ||
      !absl::SimpleAtoi(absl::string_view(response.data(), newline), &code)) {
    return absl::DataLossError(absl::StrCat(
        "malformed attach answer: '",
        absl::CEscape(absl::string_view(response.data(), std::min<size_t>(response.size(), 80))),
        "'"));
  }
  std::string output(response.substr(newline + 1));
  // HotSpot answers a failed diagnostic command with its exception's text, under code 0 in
  // some versions and a nonzero code in others.
  if (code != 0 || output.starts_with("java.lang.IllegalArgumentException") ||
      output.starts_with("java.lang.Exception")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the JVM refused the command (code ", code, "): ", absl::StripAsciiWhitespace(output)));
  }
  return output;
}

absl::StatusOr<std::string> RunDiagnosticCommand(pid_t pid, std::string_view command,
                                                 absl::Duration timeout) {
  absl::StatusOr<pid_t> ns_pid = procfs::ReadNamespacePid(pid);
  if (!ns_pid.ok()) return ns_pid.status();
  // Asked first, socket or not: a JVM killed without cleanup leaves its socket behind, and
  // pids are reused, so a socket named after `pid` proves nothing about the process.
  absl::StatusOr<bool> jvm = MapsLibjvm(pid);
  if (!jvm.ok()) return jvm.status();
  if (!*jvm) {
    return absl::DeadlineExceededError(absl::StrCat(
        "pid ", pid, " maps no libjvm.so (not a HotSpot JVM, or still starting)"));
  }
  const std::string socket_path = absl::StrCat("/proc/", pid, "/root/tmp/.java_pid", *ns_pid);
  const std::string request = EncodeAttachRequest("jcmd", command);
  if (IsSocket(socket_path)) {
    bool connected = false;
    absl::StatusOr<std::string> response = Exchange(socket_path, request, &connected);
    if (connected) {
      if (!response.ok()) return response.status();
      return ParseAttachResponse(*response);
    }
    // Nobody listens: a dead JVM's socket. Removed (as HotSpot's own start-up does) so that
    // the socket waited for below is this JVM's.
    ::unlink(socket_path.c_str());
  }
  absl::StatusOr<bool> catches = CatchesSigquit(pid);
  if (!catches.ok()) return catches.status();
  if (!*catches) {
    return absl::DeadlineExceededError(absl::StrCat(
        "pid ", pid, " does not handle SIGQUIT (started with -Xrs, or still starting)"));
  }
  absl::StatusOr<std::string> trigger = CreateTrigger(pid, *ns_pid);
  if (!trigger.ok()) return trigger.status();
  const absl::Time deadline = absl::Now() + timeout;
  bool listening = false;
  const bool signalled = ::kill(pid, SIGQUIT) == 0;
  const int kill_errno = signalled ? 0 : errno;
  if (signalled) {
    // The listener comes up within milliseconds of a JVM's next safepoint check. A JVM
    // signalled while it starts may have its new socket removed by its own start-up
    // cleanup; a second SIGQUIT, sent only while no socket is there, makes it start the
    // listener again (jcmd does the same, at half its timeout).
    const absl::Time resend_at = absl::Now() + timeout / 2;
    bool resent = false;
    while (true) {
      listening = IsSocket(socket_path);
      if (listening || absl::Now() >= deadline) break;
      if (!resent && absl::Now() >= resend_at) {
        resent = true;
        ::kill(pid, SIGQUIT);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  ::unlink(trigger->c_str());
  if (!listening) {
    if (kill_errno == ESRCH) return absl::NotFoundError(absl::StrCat("pid ", pid, " is gone"));
    return absl::DeadlineExceededError(
        absl::StrCat("pid ", pid, ": no attach listener at ", socket_path, " after ",
                     absl::FormatDuration(timeout), " (attach disabled, or not HotSpot)"));
  }
  absl::StatusOr<std::string> response = Exchange(socket_path, request);
  if (!response.ok()) return response.status();
  return ParseAttachResponse(*response);
}

}  // namespace strata::agent::jvm
