// demo_service: a CPU-bound stand-in for a request-serving process, with known hot paths.
//
//   main -> serve_forever -> handle_request -> parse_request -> tokenize          ~60 %
//   main -> serve_forever -> handle_request -> compress_response -> deflate_block ~30 %
//   main -> serve_forever -> recompute_stats -> fib (recursive)                   ~10 %
//
// Two threads run serve_forever (the main thread and one worker). Work per request is
// calibrated in CPU time at start-up so the shares hold on any machine. Built at -O2 without
// frame pointers; the path functions are noinline and have C linkage so their names are
// stable in every symbolizer.
//
// Flags: --seconds N (default: run until killed), --switch-after S (after S seconds the
// program changes phase: tokenize drops to ~5 % and deflate_block rises to ~85 %),
// --threads N (default 2).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_switched{false};
volatile uint64_t g_sink;

// Iterations of each kernel per millisecond of CPU, measured at start-up.
double g_tokenize_per_ms = 1;
double g_deflate_per_ms = 1;
double g_fib_calls_per_ms = 1;

double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// This thread's current speed of each kernel, iterations per CPU millisecond.
thread_local double t_tokenize_per_ms = 1;
thread_local double t_deflate_per_ms = 1;
thread_local double t_fib_calls_per_ms = 1;

// Moves a speed estimate towards what the last call measured (smoothed: one slow call, e.g.
// a preemption inside it, must not swing the shares).
void Adapt(double* per_ms, uint64_t iterations, double ms) {
  if (iterations == 0 || ms <= 0.01) return;
  *per_ms = 0.8 * *per_ms + 0.2 * (static_cast<double>(iterations) / ms);
}

}  // namespace

extern "C" {

__attribute__((noinline)) uint64_t tokenize(uint64_t iterations) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < iterations; ++i) {
    h ^= (i & 0xff) + ' ';
    h *= 1099511628211ull;
    asm volatile("" : "+r"(h));
  }
  return h;
}

__attribute__((noinline)) uint64_t parse_request(uint64_t iterations) {
  uint64_t r = tokenize(iterations);
  asm volatile("" : "+r"(r));
  return r + 1;
}

__attribute__((noinline)) uint64_t deflate_block(uint64_t iterations) {
  uint64_t a = 1, b = 0;
  for (uint64_t i = 0; i < iterations; ++i) {
    a = (a + (i ^ 0x5a)) % 65521;
    b = (b + a) % 65521;
    asm volatile("" : "+r"(a), "+r"(b));
  }
  return (b << 16) | a;
}

__attribute__((noinline)) uint64_t compress_response(uint64_t iterations) {
  uint64_t r = deflate_block(iterations);
  asm volatile("" : "+r"(r));
  return r + 1;
}

__attribute__((noinline)) uint64_t handle_request(uint64_t parse_iterations,
                                                  uint64_t deflate_iterations) {
  const double t0 = ThreadCpuMs();
  uint64_t r = parse_request(parse_iterations);
  const double t1 = ThreadCpuMs();
  r += compress_response(deflate_iterations);
  const double t2 = ThreadCpuMs();
  Adapt(&t_tokenize_per_ms, parse_iterations, t1 - t0);
  Adapt(&t_deflate_per_ms, deflate_iterations, t2 - t1);
  asm volatile("" : "+r"(r));
  return r;
}

__attribute__((noinline)) uint64_t fib(uint64_t n) {
  if (n < 2) return n;
  uint64_t r = fib(n - 1) + fib(n - 2);
  asm volatile("" : "+r"(r));
  return r;
}

__attribute__((noinline)) uint64_t recompute_stats(uint64_t repetitions) {
  uint64_t r = 0;
  for (uint64_t i = 0; i < repetitions; ++i) r += fib(18);
  asm volatile("" : "+r"(r));
  return r;
}

__attribute__((noinline)) void serve_forever() {
  // One "request" = 6 ms parse + 3 ms compress + 1 ms stats, in CPU time. The iteration
  // counts follow each kernel's measured speed on this thread, so the shares hold while other
  // processes compete for the core (they slow the kernels unevenly).
  t_tokenize_per_ms = g_tokenize_per_ms;
  t_deflate_per_ms = g_deflate_per_ms;
  t_fib_calls_per_ms = g_fib_calls_per_ms;
  while (!g_stop.load(std::memory_order_relaxed)) {
    const bool switched = g_switched.load(std::memory_order_relaxed);
    const double parse_ms = switched ? 0.5 : 6;
    const double deflate_ms = switched ? 8.5 : 3;
    g_sink = handle_request(static_cast<uint64_t>(parse_ms * t_tokenize_per_ms),
                            static_cast<uint64_t>(deflate_ms * t_deflate_per_ms));
    const uint64_t fib_calls = static_cast<uint64_t>(1.0 * t_fib_calls_per_ms);
    const double t0 = ThreadCpuMs();
    g_sink = recompute_stats(fib_calls);
    Adapt(&t_fib_calls_per_ms, fib_calls, ThreadCpuMs() - t0);
  }
}

}  // extern "C"

namespace {

template <typename F>
double PerMs(F f, uint64_t n) {
  const double start = ThreadCpuMs();
  f(n);
  const double ms = ThreadCpuMs() - start;
  return n / (ms > 0.01 ? ms : 0.01);
}

void Calibrate() {
  // Best of three so a busy neighbour during start-up does not skew the shares much.
  for (int i = 0; i < 3; ++i) {
    g_tokenize_per_ms = std::max(g_tokenize_per_ms, PerMs(tokenize, 20'000'000));
    g_deflate_per_ms = std::max(g_deflate_per_ms, PerMs(deflate_block, 5'000'000));
    g_fib_calls_per_ms = std::max(g_fib_calls_per_ms, PerMs(recompute_stats, 200));
  }
}

void HandleSignal(int) { g_stop.store(true); }

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0, switch_after = 0;
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--switch-after") && i + 1 < argc) {
      switch_after = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--seconds N] [--switch-after S] [--threads N]\n", argv[0]);
      return 2;
    }
  }
  if (threads < 1) threads = 1;
  signal(SIGTERM, HandleSignal);
  signal(SIGINT, HandleSignal);
  Calibrate();
  std::printf("demo_service pid %d ready\n", getpid());
  std::fflush(stdout);

  std::thread timer([&] {
    timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (!g_stop.load()) {
      timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      const double elapsed = (now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9;
      if (switch_after > 0 && elapsed >= switch_after) g_switched.store(true);
      if (seconds > 0 && elapsed >= seconds) g_stop.store(true);
      usleep(20'000);
    }
  });
  std::vector<std::thread> workers;
  for (int i = 1; i < threads; ++i) workers.emplace_back(serve_forever);
  serve_forever();
  for (auto& t : workers) t.join();
  timer.join();
  return 0;
}
