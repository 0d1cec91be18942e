// agent/jvm (strata::agent::jvm): names for the code a HotSpot JVM compiles at run time.
//
// HotSpot writes a perf map of its code cache (/tmp/perf-PID.map, read by symbols::PerfMapFile)
// when asked with the diagnostic command `Compiler.perfmap` (JDK 17 and later). This header
// asks it the way `jcmd` does, without a JDK on the host: HotSpot's attach protocol (a trigger
// file and SIGQUIT start the JVM's attach listener, which then serves commands on a Unix
// socket in its /tmp). jvm_perf_maps.h decides when to ask, off the agent's main loop.
//
// Containers: the JVM's /tmp and pid are those of its own namespaces, reached through
// /proc/PID/root and the NSpid line of /proc/PID/status. The agent runs as root, which
// HotSpot 17 accepts as a peer of any JVM.
#ifndef STRATA_AGENT_JVM_HOTSPOT_ATTACH_H_
#define STRATA_AGENT_JVM_HOTSPOT_ATTACH_H_

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::agent::jvm {

// Whether a mapping's path is HotSpot's libjvm.so: how the agent recognises a JVM.
inline bool IsLibJvm(std::string_view path) { return path.ends_with("/libjvm.so"); }

// Runs the diagnostic command `command` (e.g. "Compiler.perfmap", "VM.version") in the JVM
// `pid` (a pid of this agent's namespace) and returns its output. Starts the JVM's attach
// listener first if it is not running, waiting up to `timeout` for it.
//  - NotFound: the process is gone.
//  - DeadlineExceeded: no attach listener came up (attach disabled with
//    -XX:+DisableAttachMechanism, signals reduced with -Xrs, or not a HotSpot JVM).
//  - FailedPrecondition: the JVM refused the command (e.g. a JDK before 17 has no
//    Compiler.perfmap); the message holds the JVM's answer.
// Blocks for up to `timeout` plus the command's run time: not for the agent's main loop.
absl::StatusOr<std::string> RunDiagnosticCommand(pid_t pid, std::string_view command,
                                                 absl::Duration timeout);

// The attach protocol's request for one command (version 1; the command and three arguments,
// each NUL-terminated), and the parse of the JVM's answer: a result code on the first line,
// the output after it. Exposed for tests.
std::string EncodeAttachRequest(std::string_view command, std::string_view argument);
absl::StatusOr<std::string> ParseAttachResponse(std::string_view response);

// Reads an answer from `fd` to its end, at most `max_bytes` of it and until `deadline`: what
// answers is the target process, which may send without end or a byte at a time.
//  - ResourceExhausted: longer than max_bytes.   - DeadlineExceeded: no end by deadline.
// Exposed for tests.
absl::StatusOr<std::string> ReadAttachAnswer(int fd, absl::Time deadline, size_t max_bytes);

}  // namespace strata::agent::jvm

#endif  // STRATA_AGENT_JVM_HOTSPOT_ATTACH_H_
