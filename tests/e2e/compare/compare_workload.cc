// compare_workload: a request loop whose work is split between three leaf functions by fixed
// iteration counts, so their CPU shares hold on any machine and under any load:
//
//   main -> serve -> handle_request -> parse_input     40 %
//                                   -> checksum_block  35 %  (x (1 + --slower))
//                                   -> encode_output   25 %
//
// --slower F adds the fraction F of checksum_block's work (a planted slowdown of one function
// in one build); --seconds N stops after N seconds (default: run until killed). Prints "ready"
// when serving and "requests=R" at exit. The leaves run one loop, so an iteration costs the
// same in each; noinline with C linkage keeps their names stable.
#include <signal.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

std::atomic<bool> g_stop{false};
volatile uint64_t g_sink;

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
__attribute__((noinline)) uint64_t handle_request(uint64_t seed, double checksum_factor) {
  const double size = 0.5 + static_cast<double>(seed >> 11) * 0x1.0p-53;
  uint64_t x = parse_input(seed, static_cast<uint64_t>(size * kParse));
  x = checksum_block(x, static_cast<uint64_t>(size * checksum_factor * kChecksum));
  x = encode_output(x, static_cast<uint64_t>(size * kEncode));
  asm volatile("" ::: "memory");  // no tail call: handle_request stays on the stack
  return x;
}

__attribute__((noinline)) uint64_t serve(double seconds, double checksum_factor) {
  timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  uint64_t requests = 0, x = 1;
  while (!g_stop.load(std::memory_order_relaxed)) {
    x = handle_request(x, checksum_factor);
    ++requests;
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
  double seconds = 0, slower = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--slower") && i + 1 < argc) {
      slower = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--seconds N] [--slower F]\n", argv[0]);
      return 2;
    }
  }
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop = true; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::printf("ready\n");
  std::fflush(stdout);
  const uint64_t requests = serve(seconds, 1 + slower);
  std::printf("requests=%llu\n", static_cast<unsigned long long>(requests));
  return 0;
}
