#include "agent/procfs/process_events.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/cn_proc.h>
#include <linux/connector.h>
#include <linux/filter.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata::agent::procfs {
namespace {

// Datagrams fetched per recvmmsg() call, and the room for each (an event is 76 bytes; the
// kernel sends one per datagram).
constexpr size_t kSlots = 64;
constexpr size_t kSlotBytes = 256;

// Where the connector message and the event start in a datagram.
constexpr size_t kCnOffset = NLMSG_HDRLEN;
constexpr size_t kEventOffset = kCnOffset + offsetof(cn_msg, data);
// The fixed head of proc_event (what, cpu, timestamp) before the per-type data.
constexpr size_t kEventHead = offsetof(proc_event, event_data);

std::string ErrnoText(int err) { return strerror(err); }

// Calls `f(cn, event, size)` for every process connector message in `data` (one datagram),
// with `size` the bytes of `event` that were received; fields past it read as zero. Anything
// malformed is skipped.
template <typename F>
void ForEachProcEvent(const uint8_t* data, size_t size, F&& f) {
  while (size >= NLMSG_HDRLEN) {
    nlmsghdr header;
    memcpy(&header, data, sizeof(header));
    if (header.nlmsg_len < NLMSG_HDRLEN || header.nlmsg_len > size) return;
    const size_t payload = header.nlmsg_len - NLMSG_HDRLEN;
    if (header.nlmsg_type != NLMSG_ERROR && header.nlmsg_type != NLMSG_NOOP &&
        header.nlmsg_type != NLMSG_OVERRUN && payload >= sizeof(cn_msg)) {
      cn_msg cn;
      memcpy(&cn, data + NLMSG_HDRLEN, sizeof(cn));
      const size_t event_size = std::min<size_t>(cn.len, payload - sizeof(cn_msg));
      if (cn.id.idx == CN_IDX_PROC && cn.id.val == CN_VAL_PROC && event_size >= kEventHead) {
        // The event sits at an offset that is not 8-aligned: copy it out.
        proc_event event;
        memset(&event, 0, sizeof(event));
        memcpy(&event, data + NLMSG_HDRLEN + sizeof(cn_msg), std::min(event_size, sizeof(event)));
        f(cn, event, event_size);
      }
    }
    const size_t step = NLMSG_ALIGN(header.nlmsg_len);
    if (step >= size) return;
    data += step;
    size -= step;
  }
}

// Appends the event if it is one the agent uses.
void AppendEvent(const proc_event& event, size_t size, ProcessEventBatch* out) {
  switch (event.what) {
    case proc_event::PROC_EVENT_FORK: {
      if (size < kEventHead + sizeof(event.event_data.fork)) return;
      const auto& fork = event.event_data.fork;
      out->events.push_back(ProcessEvent{fork.child_pid == fork.child_tgid
                                             ? ProcessEventType::kProcessStarted
                                             : ProcessEventType::kThreadStarted,
                                         fork.child_tgid, fork.child_pid, event.timestamp_ns});
      return;
    }
    case proc_event::PROC_EVENT_EXEC: {
      if (size < kEventHead + sizeof(event.event_data.exec)) return;
      const auto& exec = event.event_data.exec;
      out->events.push_back(ProcessEvent{ProcessEventType::kExec, exec.process_tgid,
                                         exec.process_pid, event.timestamp_ns});
      return;
    }
    case proc_event::PROC_EVENT_EXIT: {
      // process_pid and process_tgid are the first 8 bytes on every kernel.
      if (size < kEventHead + 2 * sizeof(pid_t)) return;
      const auto& exit = event.event_data.exit;
      out->events.push_back(ProcessEvent{exit.process_pid == exit.process_tgid
                                             ? ProcessEventType::kProcessExited
                                             : ProcessEventType::kThreadExited,
                                         exit.process_tgid, exit.process_pid, event.timestamp_ns});
      return;
    }
    default:
      return;  // acks and the event types the filter drops
  }
}

// Classic BPF over each datagram (nlmsghdr, cn_msg, proc_event): keeps fork, exec, exit and
// acknowledgements (PROC_EVENT_NONE), drops the rest. Absolute loads read big-endian, the
// fields are host order, hence htonl on the constants.
constexpr uint32_t kAccept = 0xffffffff;

std::vector<sock_filter> UnusedEventsFilter() {
  return {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kCnOffset + offsetof(cn_msg, id) + offsetof(cb_id, idx)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(CN_IDX_PROC), 0, 8),  // not ours: accept
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kCnOffset + offsetof(cn_msg, id) + offsetof(cb_id, val)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(CN_VAL_PROC), 0, 6),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kEventOffset + offsetof(proc_event, what)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(proc_event::PROC_EVENT_FORK), 4, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(proc_event::PROC_EVENT_EXEC), 3, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(proc_event::PROC_EVENT_EXIT), 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(proc_event::PROC_EVENT_NONE), 1, 0),
      BPF_STMT(BPF_RET | BPF_K, 0),
      BPF_STMT(BPF_RET | BPF_K, kAccept),
  };
}

// The same, and of fork, exec and exit only those of the given processes: a fork by the
// process the new task joins (child_tgid: a new thread's parent fields name the process's
// parent, not the process), an exec or exit by its process_tgid. At most kMaxWatchedPids,
// which keeps every jump within the 8-bit offsets of classic BPF.
std::vector<sock_filter> WatchedProcessesFilter(const std::vector<pid_t>& pids) {
  const size_t n = pids.size();
  // Layout: 0-4 header checks and the type load; 5-8 type dispatch; 9 drop; 10-11 fork's load
  // and a jump over 12, exec's and exit's load; 13.. one compare per pid; then drop, accept.
  const size_t compare = 13, drop = compare + n, accept = drop + 1;
  auto to = [](size_t from, size_t target) { return static_cast<uint8_t>(target - from - 1); };
  static_assert(offsetof(proc_event, event_data.exec.process_tgid) ==
                offsetof(proc_event, event_data.exit.process_tgid));
  std::vector<sock_filter> code = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kCnOffset + offsetof(cn_msg, id) + offsetof(cb_id, idx)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(CN_IDX_PROC), 0, to(1, accept)),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kCnOffset + offsetof(cn_msg, id) + offsetof(cb_id, val)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(CN_VAL_PROC), 0, to(3, accept)),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kEventOffset + offsetof(proc_event, what)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(proc_event::PROC_EVENT_NONE), to(5, accept), 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(proc_event::PROC_EVENT_FORK), to(6, 10), 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(proc_event::PROC_EVENT_EXEC), to(7, 12), 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(proc_event::PROC_EVENT_EXIT), to(8, 12), 0),
      BPF_STMT(BPF_RET | BPF_K, 0),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
               kEventOffset + offsetof(proc_event, event_data.fork.child_tgid)),
      BPF_STMT(BPF_JMP | BPF_JA, to(11, compare)),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
               kEventOffset + offsetof(proc_event, event_data.exec.process_tgid)),
  };
  for (size_t i = 0; i < n; ++i) {
    code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(static_cast<uint32_t>(pids[i])),
                            to(compare + i, accept), 0));
  }
  code.push_back(BPF_STMT(BPF_RET | BPF_K, 0));
  code.push_back(BPF_STMT(BPF_RET | BPF_K, kAccept));
  return code;
}

absl::Status AttachFilter(int fd, std::vector<sock_filter> code) {
  sock_fprog program{static_cast<unsigned short>(code.size()), code.data()};
  if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &program, sizeof(program)) != 0) {
    return absl::InternalError(
        absl::StrCat("attach the process connector filter: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

// Tags subscriptions so that Open() recognizes the kernel's answer to its own among the
// acknowledgements every listener receives.
uint32_t NextAck() {
  static std::atomic<uint32_t> counter{0};
  return (static_cast<uint32_t>(getpid()) << 12) ^ (counter.fetch_add(1) + 1);
}

}  // namespace

struct ProcessEvents::Receiver {
  Receiver() {
    memset(headers, 0, sizeof(headers));
    for (size_t i = 0; i < kSlots; ++i) {
      iov[i].iov_base = buffer + i * kSlotBytes;
      iov[i].iov_len = kSlotBytes;
      headers[i].msg_hdr.msg_iov = &iov[i];
      headers[i].msg_hdr.msg_iovlen = 1;
      headers[i].msg_hdr.msg_name = &senders[i];
    }
  }

  // Receives up to kSlots datagrams; the count, or -1 with errno set.
  int Receive(int fd) {
    for (size_t i = 0; i < kSlots; ++i) headers[i].msg_hdr.msg_namelen = sizeof(senders[i]);
    return recvmmsg(fd, headers, kSlots, MSG_DONTWAIT, nullptr);
  }

  // Datagram `i` of the last Receive(), or an empty span if it did not come from the kernel:
  // root processes could send to the group too.
  std::pair<const uint8_t*, size_t> Datagram(int i) const {
    if (headers[i].msg_hdr.msg_namelen < sizeof(sockaddr_nl) || senders[i].nl_pid != 0) {
      return {nullptr, 0};
    }
    return {buffer + i * kSlotBytes, std::min<size_t>(headers[i].msg_len, kSlotBytes)};
  }

  alignas(8) uint8_t buffer[kSlots * kSlotBytes];
  iovec iov[kSlots];
  sockaddr_nl senders[kSlots];
  mmsghdr headers[kSlots];
};

ProcessEvents::ProcessEvents(int fd) : fd_(fd), receiver_(std::make_unique<Receiver>()) {}

ProcessEvents::~ProcessEvents() {
  // The kernel counts listeners and builds events only while there are some: unsubscribe.
  if (listening_) Subscribe(false, NextAck()).IgnoreError();
  close(fd_);
}

absl::StatusOr<std::unique_ptr<ProcessEvents>> ProcessEvents::Open() { return Open(Options()); }

absl::StatusOr<std::unique_ptr<ProcessEvents>> ProcessEvents::Open(const Options& options) {
  const int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_CONNECTOR);
  if (fd < 0) {
    const int err = errno;
    std::string message = absl::StrCat("process connector socket: ", ErrnoText(err));
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
    return absl::UnavailableError(
        absl::StrCat(message, " (kernel without CONFIG_CONNECTOR/CONFIG_PROC_EVENTS?)"));
  }
  // Owns the fd from here on.
  std::unique_ptr<ProcessEvents> events(new ProcessEvents(fd));

  // Filter first, so that no unwanted event is queued even between bind and the first read.
  if (options.filter_unused_events) {
    if (absl::Status st = AttachFilter(fd, UnusedEventsFilter()); !st.ok()) return st;
  }
  // Beyond net.core.rmem_max only with CAP_NET_ADMIN (SO_RCVBUFFORCE); else capped there.
  if (options.receive_buffer_bytes > 0 &&
      setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &options.receive_buffer_bytes,
                 sizeof(options.receive_buffer_bytes)) != 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &options.receive_buffer_bytes,
               sizeof(options.receive_buffer_bytes));
  }

  sockaddr_nl address{};
  address.nl_family = AF_NETLINK;
  address.nl_groups = CN_IDX_PROC;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    const int err = errno;
    if (err == EPERM || err == EACCES) {
      return absl::PermissionDeniedError(absl::StrCat(
          "join the process connector group: ", ErrnoText(err), " (needs CAP_NET_ADMIN)"));
    }
    return absl::UnavailableError(
        absl::StrCat("join the process connector group: ", ErrnoText(err)));
  }

  const uint32_t ack = NextAck();
  if (absl::Status status = events->Subscribe(true, ack); !status.ok()) return status;
  events->listening_ = true;
  if (absl::Status status = events->AwaitAck(ack, options.subscribe_timeout); !status.ok()) {
    return status;
  }
  return events;
}

absl::Status ProcessEvents::Subscribe(bool listen, uint32_t ack) {
  const proc_cn_mcast_op op = listen ? PROC_CN_MCAST_LISTEN : PROC_CN_MCAST_IGNORE;
  constexpr size_t kPayload = sizeof(cn_msg) + sizeof(op);
  nlmsghdr header{};
  header.nlmsg_len = NLMSG_LENGTH(kPayload);
  header.nlmsg_type = NLMSG_DONE;
  cn_msg cn{};
  cn.id.idx = CN_IDX_PROC;
  cn.id.val = CN_VAL_PROC;
  cn.ack = ack;
  cn.len = sizeof(op);
  alignas(NLMSG_ALIGNTO) uint8_t message[NLMSG_SPACE(kPayload)] = {};
  memcpy(message, &header, sizeof(header));
  memcpy(message + NLMSG_HDRLEN, &cn, sizeof(cn));
  memcpy(message + NLMSG_HDRLEN + sizeof(cn), &op, sizeof(op));

  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  for (;;) {
    if (sendto(fd_, message, header.nlmsg_len, 0, reinterpret_cast<const sockaddr*>(&kernel),
               sizeof(kernel)) == static_cast<ssize_t>(header.nlmsg_len)) {
      return absl::OkStatus();
    }
    if (errno == EINTR) continue;
    const int err = errno;
    std::string text = absl::StrCat("subscribe to the process connector: ", ErrnoText(err));
    if (err == EPERM || err == EACCES) return absl::PermissionDeniedError(text);
    return absl::UnavailableError(text);
  }
}

absl::Status ProcessEvents::AwaitAck(uint32_t ack, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::optional<uint32_t> error;
  for (;;) {
    const int n = receiver_->Receive(fd_);
    if (n < 0) {
      if (errno == EINTR || errno == ENOBUFS) continue;  // lost events predate Open()
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return absl::UnavailableError(
            absl::StrCat("read from the process connector: ", ErrnoText(errno)));
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd ready{fd_, POLLIN, 0};
      poll(&ready, 1, static_cast<int>(left.count()) + 1);
      continue;
    }
    for (int i = 0; i < n; ++i) {
      auto [data, size] = receiver_->Datagram(i);
      ForEachProcEvent(data, size, [&](const cn_msg& cn, const proc_event& event, size_t) {
        if (event.what == proc_event::PROC_EVENT_NONE && cn.ack == ack + 1) {
          error = event.event_data.ack.err;
        }
      });
    }
    if (error.has_value() || std::chrono::steady_clock::now() >= deadline) break;
  }
  if (!error.has_value()) {
    return absl::UnavailableError(
        "the process connector ignored the subscription: it serves only the initial pid and "
        "user namespaces (is the agent in a container without the host's pid namespace?)");
  }
  if (*error == 0) return absl::OkStatus();
  std::string text = absl::StrCat("the process connector refused the subscription: ",
                                  ErrnoText(static_cast<int>(*error)));
  if (*error == EPERM || *error == EACCES) {
    return absl::PermissionDeniedError(absl::StrCat(text, " (needs CAP_NET_ADMIN)"));
  }
  return absl::UnavailableError(text);
}

absl::Status ProcessEvents::WatchOnly(std::optional<std::vector<pid_t>> pids) {
  if (pids && (pids->size() > kMaxWatchedPids || pid_filter_failed_)) pids.reset();
  if (pids == watched_) return absl::OkStatus();
  absl::Status st = AttachFilter(fd_, pids ? WatchedProcessesFilter(*pids) : UnusedEventsFilter());
  if (st.ok()) {
    watched_ = std::move(pids);
    return st;
  }
  // An old pid filter must not stay: it would drop the events of processes watched since.
  // Every process's events from now on; said once.
  pid_filter_failed_ = true;
  watched_ = std::nullopt;
  if (absl::Status all = AttachFilter(fd_, UnusedEventsFilter()); !all.ok()) return all;
  return st;
}

absl::Status ProcessEvents::Read(ProcessEventBatch* out) {
  size_t messages = 0;
  while (messages < kMaxMessagesPerRead) {
    const int n = receiver_->Receive(fd_);
    if (n < 0) {
      switch (errno) {
        case EINTR:
          continue;
        case EAGAIN:
#if EWOULDBLOCK != EAGAIN
        case EWOULDBLOCK:
#endif
          return absl::OkStatus();
        case ENOBUFS:
          // Reported once per overflow, before the events that still made it into the queue.
          out->overflowed = true;
          ++overflows_;
          continue;
        default:
          return absl::InternalError(
              absl::StrCat("read from the process connector: ", ErrnoText(errno)));
      }
    }
    for (int i = 0; i < n; ++i) {
      auto [data, size] = receiver_->Datagram(i);
      ForEachProcEvent(data, size, [out](const cn_msg&, const proc_event& event, size_t bytes) {
        AppendEvent(event, bytes, out);
      });
    }
    messages += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace strata::agent::procfs
