// compare_workload: a request loop whose work is split between three leaf functions by fixed
// iteration counts, so their CPU shares hold on any machine and under any load:
//
//   main -> serve -> handle_request -> parse_input     40 %
//                                   -> checksum_block  35 %  (x (1 + --slower))
//                                   -> encode_output   25 %
//
// --slower F adds the fraction F of checksum_block's work (a planted slowdown of one function
// in one build); --cost C scales every part of a request by C (a build that serves more
// requests per CPU second, with the same shares); --seconds N stops after N seconds (default:
// run until killed); --metrics-port P serves the requests so far as a Prometheus counter,
// compare_requests_total{code="200"}, at http://127.0.0.1:P/metrics (0: any port, printed as
// "metrics=PORT") from a side thread. Prints "ready" when serving and "requests=R" at exit.
// The leaves run one loop, so an iteration costs the same in each; noinline with C linkage
// keeps their names stable.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

std::atomic<bool> g_stop{false};
std::atomic<uint64_t> g_requests{0};
volatile uint64_t g_sink;

// Answers every connection to `fd` with the requests counter (HTTP/1.0, then close).
void ServeMetrics(int fd) {
  while (true) {
    const int client = accept(fd, nullptr, nullptr);
    if (client < 0) continue;
    std::string request;
    char buffer[1024];
    while (request.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = read(client, buffer, sizeof(buffer));
      if (n <= 0) break;
      request.append(buffer, static_cast<size_t>(n));
    }
    const std::string response =
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\r\n"
        "# HELP compare_requests_total Requests served.\n"
        "# TYPE compare_requests_total counter\n"
        "compare_requests_total{code=\"200\"} " +
        std::to_string(g_requests.load()) + "\n";
    (void)!write(client, response.data(), response.size());
    close(client);
  }
}

// The metrics listener on 127.0.0.1:port (0: any); its port, or 0 when it cannot listen.
int ListenForMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t size = sizeof(address);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), size) != 0 ||
      listen(fd, 16) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    return 0;
  }
  std::thread(ServeMetrics, fd).detach();
  return ntohs(address.sin_port);
}

constexpr uint64_t kParse = 40'000, kChecksum = 35'000, kEncode = 25'000;

inline uint64_t Spin(uint64_t seed, uint64_t iterations) {
  uint64_t x = seed;
  for (uint64_t i = 0; i < iterations; ++i) {
    x = x * 6364136223846793005ULL + i;
    x ^= x >> 29;
  }
  return x;
}

}  // namespace

extern "C" {
__attribute__((noinline)) uint64_t parse_input(uint64_t seed, uint64_t iterations) {
  return Spin(seed, iterations);
}
__attribute__((noinline)) uint64_t checksum_block(uint64_t seed, uint64_t iterations) {
  return Spin(seed, iterations);
}
__attribute__((noinline)) uint64_t encode_output(uint64_t seed, uint64_t iterations) {
  return Spin(seed, iterations);
}

// A request's size varies (0.5x to 1.5x, the three parts alike): a fixed period would
// beat against the profiler's sampling period and bias each process's shares its own way.
__attribute__((noinline)) uint64_t handle_request(uint64_t seed, double checksum_factor,
                                                  double cost) {
  const double size = cost * (0.5 + static_cast<double>(seed >> 11) * 0x1.0p-53);
  uint64_t x = parse_input(seed, static_cast<uint64_t>(size * kParse));
  x = checksum_block(x, static_cast<uint64_t>(size * checksum_factor * kChecksum));
  x = encode_output(x, static_cast<uint64_t>(size * kEncode));
  asm volatile("" ::: "memory");  // no tail call: handle_request stays on the stack
  return x;
}

__attribute__((noinline)) uint64_t serve(double seconds, double checksum_factor, double cost) {
  timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  uint64_t requests = 0, x = 1;
  while (!g_stop.load(std::memory_order_relaxed)) {
    x = handle_request(x, checksum_factor, cost);
    ++requests;
    g_requests.store(requests, std::memory_order_relaxed);
    if (seconds > 0 && requests % 64 == 0) {
      timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      if (now.tv_sec - start.tv_sec + (now.tv_nsec - start.tv_nsec) * 1e-9 >= seconds) break;
    }
  }
  g_sink = x;
  asm volatile("" ::: "memory");
  return requests;
}
}

int main(int argc, char** argv) {
  double seconds = 0, slower = 0, cost = 1;
  int metrics_port = -1;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--slower") && i + 1 < argc) {
      slower = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--cost") && i + 1 < argc) {
      cost = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--metrics-port") && i + 1 < argc) {
      metrics_port = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--seconds N] [--slower F] [--cost C] [--metrics-port P]\n",
                   argv[0]);
      return 2;
    }
  }
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop = true; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  if (metrics_port >= 0) {
    const int port = ListenForMetrics(metrics_port);
    if (port == 0) {
      std::perror("metrics listener");
      return 1;
    }
    std::printf("metrics=%d\n", port);
  }
  std::printf("ready\n");
  std::fflush(stdout);
  const uint64_t requests = serve(seconds, 1 + slower, cost);
  std::printf("requests=%llu\n", static_cast<unsigned long long>(requests));
  return 0;
}
