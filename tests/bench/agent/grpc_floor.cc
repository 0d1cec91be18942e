// grpc_floor: what one message on a gRPC stream costs the thread that sends it, on this host:
// the floor under the agent's shipper (agent/core/shipper.h). An Ingest.Connect stream on
// loopback to an in-process server that answers each message with an Ack; one thread writes
// a batch of --bytes every --period-ms and sleeps in between, reading the acknowledgement
// that came meanwhile before its next write, as the shipper does at short intervals. The
// thread's CPU per message (CLOCK_THREAD_CPUTIME_ID: what schedstat counts, wake-ups
// included) is the figure to read the shipper's µs per batch against; side_by_side.sh
// FLOOR=1 runs the two side by side. No spool, no serialization of real contexts, no timers,
// no reconnects: all that is left is gRPC's path for one message each way.
//
// With --socket, the same messages then go over a plain loopback TCP socket to a thread that
// answers each with 16 bytes, on the same schedule: the kernel's own cost of a message and its
// answer (wake-up, send, the loopback delivery that runs in the sender's thread, the read),
// under any transport the agent could use; printed after gRPC's, with the ratio.
//
//   grpc_floor [--period-ms 1000] [--warmup-s 6] [--seconds 40] [--bytes 300] [--socket]
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "grpcpp/grpcpp.h"
#include "strata/v1/ingest.grpc.pb.h"

namespace {

using strata::v1::AgentMessage;
using strata::v1::ServerMessage;

// Acknowledges every batch it reads, at once.
class AckingIngest final : public strata::v1::Ingest::Service {
  grpc::Status Connect(grpc::ServerContext*,
                       grpc::ServerReaderWriter<ServerMessage, AgentMessage>* stream) override {
    AgentMessage in;
    ServerMessage ack;
    while (stream->Read(&in)) {
      ack.mutable_ack()->set_sequence(in.sample_batch().sequence());
      if (!stream->Write(ack)) break;
    }
    return grpc::Status::OK;
  }
};

int64_t ThreadCpuNs() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

struct Measured {
  int messages = 0;
  int64_t cpu_ns = 0;                // the sending thread, over the window
  std::vector<int64_t> per_message;  // read + write, ns, without the wake-up
  bool ok = true;
};

Measured Send(const std::string& address, int period_ms, int warmup_s, int seconds,
              int bytes) {
  Measured m;
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = strata::v1::Ingest::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->Connect(&context);
  AgentMessage message;
  message.mutable_sample_batch()->set_packed_contexts(std::string(bytes, '\x5a'));
  ServerMessage ack;
  const auto period = std::chrono::milliseconds(period_ms);
  const int warmup = warmup_s * 1000 / period_ms;
  const int total = warmup + seconds * 1000 / period_ms;
  auto next = std::chrono::steady_clock::now();
  int64_t window_start = 0;
  for (int i = 0; i < total; ++i) {
    std::this_thread::sleep_until(next);
    next += period;
    if (i == warmup) window_start = ThreadCpuNs();
    const int64_t before = ThreadCpuNs();
    if (i > 0 && (!stream->Read(&ack) || ack.ack().sequence() != static_cast<uint64_t>(i))) {
      m.ok = false;
      break;
    }
    message.mutable_sample_batch()->set_sequence(i + 1);
    if (!stream->Write(message)) {
      m.ok = false;
      break;
    }
    if (i >= warmup) {
      m.per_message.push_back(ThreadCpuNs() - before);
      ++m.messages;
    }
  }
  m.cpu_ns = ThreadCpuNs() - window_start;
  stream->WritesDone();
  while (stream->Read(&ack)) {
  }
  (void)stream->Finish();
  return m;
}

// The same schedule as Send(), on a plain TCP socket: the previous answer read, the message
// written, nothing else.
Measured SendOnSocket(int period_ms, int warmup_s, int seconds, int bytes) {
  Measured m;
  m.ok = false;
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return m;
  }
  constexpr size_t kAnswer = 16;
  const auto read_exactly = [](int fd, char* out, size_t n) {
    for (size_t got = 0; got < n;) {
      const ssize_t r = read(fd, out + got, n - got);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  };
  std::thread answerer([&] {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::string in(static_cast<size_t>(bytes), '\0');
    const char answer[kAnswer] = {};
    while (read_exactly(fd, in.data(), in.size()) &&
           write(fd, answer, kAnswer) == static_cast<ssize_t>(kAnswer)) {
    }
    close(fd);
  });
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&address), length) == 0 &&
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0) {
    m.ok = true;
    const std::string message(static_cast<size_t>(bytes), '\x5a');
    char answer[kAnswer];
    const auto period = std::chrono::milliseconds(period_ms);
    const int warmup = warmup_s * 1000 / period_ms;
    const int total = warmup + seconds * 1000 / period_ms;
    auto next = std::chrono::steady_clock::now();
    int64_t window_start = 0;
    for (int i = 0; i < total && m.ok; ++i) {
      std::this_thread::sleep_until(next);
      next += period;
      if (i == warmup) window_start = ThreadCpuNs();
      const int64_t before = ThreadCpuNs();
      m.ok = (i == 0 || read_exactly(fd, answer, kAnswer)) &&
             write(fd, message.data(), message.size()) == static_cast<ssize_t>(message.size());
      if (m.ok && i >= warmup) {
        m.per_message.push_back(ThreadCpuNs() - before);
        ++m.messages;
      }
    }
    m.cpu_ns = ThreadCpuNs() - window_start;
  }
  if (fd >= 0) close(fd);  // the answerer's read ends
  answerer.join();
  close(listener);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"grpc_floor: the CPU one message on a gRPC stream costs its sending thread"};
  int period_ms = 1000, warmup_s = 6, seconds = 40, bytes = 300;
  app.add_option("--period-ms", period_ms, "one message every this many ms")
      ->check(CLI::Range(10, 60'000));
  app.add_option("--warmup-s", warmup_s, "messages before the window")->check(CLI::Range(0, 600));
  app.add_option("--seconds", seconds, "the measured window")->check(CLI::Range(1, 3600));
  app.add_option("--bytes", bytes, "each batch's payload")->check(CLI::Range(0, 1 << 20));
  bool also_socket = false;
  app.add_flag("--socket", also_socket, "then the same messages on a plain TCP socket");
  CLI11_PARSE(app, argc, argv);

  AckingIngest service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "grpc_floor: cannot listen on 127.0.0.1\n");
    return 1;
  }
  Measured m;
  std::thread sender([&] {
    pthread_setname_np(pthread_self(), "grpc-floor");
    m = Send("127.0.0.1:" + std::to_string(port), period_ms, warmup_s, seconds, bytes);
  });
  sender.join();
  server->Shutdown();
  if (!m.ok || m.messages == 0) {
    std::fprintf(stderr, "grpc_floor: the stream failed after %d messages\n", m.messages);
    return 1;
  }
  std::sort(m.per_message.begin(), m.per_message.end());
  std::printf("grpc_floor: %d messages of %d bytes, one every %d ms: %.0f µs of the sending "
              "thread's CPU a message (wake-up included), median %.0f µs from the read to the "
              "write's return\n",
              m.messages, bytes, period_ms, m.cpu_ns / 1e3 / m.messages,
              m.per_message[m.per_message.size() / 2] / 1e3);
  if (!also_socket) return 0;
  Measured plain;
  std::thread socket_sender([&] {
    pthread_setname_np(pthread_self(), "socket-floor");
    plain = SendOnSocket(period_ms, warmup_s, seconds, bytes);
  });
  socket_sender.join();
  if (!plain.ok || plain.messages == 0) {
    std::fprintf(stderr, "grpc_floor: the plain socket failed after %d messages\n",
                 plain.messages);
    return 1;
  }
  std::sort(plain.per_message.begin(), plain.per_message.end());
  const double grpc_us = m.cpu_ns / 1e3 / m.messages;
  const double plain_us = plain.cpu_ns / 1e3 / plain.messages;
  std::printf("plain TCP socket: %d messages, the same schedule: %.0f µs of its sending thread's "
              "CPU a message, median %.0f µs from the read to the write's return; gRPC %.2fx "
              "of it, %.0f µs more\n",
              plain.messages, plain_us, plain.per_message[plain.per_message.size() / 2] / 1e3,
              grpc_us / plain_us, grpc_us - plain_us);
  return 0;
}
