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
// program changes phase: tokenize drops to ~5 % and deflate_block rises to ~85 %; SIGUSR1
// changes it at once, for tests that switch when the profiler has seen enough of the first),
// --threads N (default 2), --idle-threads N (default 0: N more threads that block forever on
// a condition variable, with 64 KiB stacks), --fixed-work (every request does the same
// number of iterations, fixed at start-up calibration, instead of following each thread's
// measured speed: requests per second then measure throughput, e.g. how much a profiler
// slows the process; with the default adaptive work a slowdown is absorbed into smaller
// requests), --warmup W (requests are counted from W seconds after start-up).
//
// At exit (--seconds elapsed, SIGTERM or SIGINT) prints one line on stdout:
//   demo_service done: requests=R seconds=S requests_per_second=X cpu_us_per_request=C
//   tokenize_pct=T deflate_pct=D fib_pct=F
// counting the requests completed by all serving threads between the end of --warmup and
// the stop; C is the process's CPU time over the same window per request. T, D and F are
// the demo's own account of where its serving threads' CPU time went over that window (each
// path's thread CPU time, as the path measures it, in percent of the three's sum): the
// ground truth a profile's shares are checked against. The kernel charges
// a profiler's sampling interrupts (and its stack copies) to the interrupted thread, and a
// VM's steal time is not CPU time (CONFIG_PARAVIRT_TIME_ACCOUNTING): C shows the cost a
// profiler adds inside the process without the noise of other load on the host.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_switched{false};
std::atomic<uint64_t> g_requests{0};  // completed requests, all serving threads
// Thread CPU time each path took, all serving threads, microseconds.
std::atomic<uint64_t> g_tokenize_us{0}, g_deflate_us{0}, g_fib_us{0};
bool g_fixed_work = false;
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
  if (!g_fixed_work) {
    Adapt(&t_tokenize_per_ms, parse_iterations, t1 - t0);
    Adapt(&t_deflate_per_ms, deflate_iterations, t2 - t1);
  }
  g_tokenize_us.fetch_add(static_cast<uint64_t>((t1 - t0) * 1e3), std::memory_order_relaxed);
  g_deflate_us.fetch_add(static_cast<uint64_t>((t2 - t1) * 1e3), std::memory_order_relaxed);
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
  // One "request" = 6 ms parse + 3 ms compress + 1 ms stats, in CPU time, times a random
  // scale from 0.5 to 1.5 per request (the shares kept). A request of a fixed 10 ms would
  // run in step with a sampler at 99 Hz (10.1 ms): its samples would fall on the same part of
  // every request for seconds on end, and a profile's shares would swing by 20 points. The
  // iteration counts follow each kernel's measured speed on this thread, so the shares hold
  // while other processes compete for the core (they slow the kernels unevenly).
  t_tokenize_per_ms = g_tokenize_per_ms;
  t_deflate_per_ms = g_deflate_per_ms;
  t_fib_calls_per_ms = g_fib_calls_per_ms;
  std::minstd_rand random(static_cast<uint32_t>(ThreadCpuMs() * 1e6) ^
                          static_cast<uint32_t>(pthread_self()));
  std::uniform_real_distribution<double> scale_of(0.5, 1.5);
  while (!g_stop.load(std::memory_order_relaxed)) {
    const bool switched = g_switched.load(std::memory_order_relaxed);
    const double scale = g_fixed_work ? 1 : scale_of(random);
    const double parse_ms = scale * (switched ? 0.5 : 6);
    const double deflate_ms = scale * (switched ? 8.5 : 3);
    g_sink = handle_request(static_cast<uint64_t>(parse_ms * t_tokenize_per_ms),
                            static_cast<uint64_t>(deflate_ms * t_deflate_per_ms));
    const uint64_t fib_calls = static_cast<uint64_t>(scale * t_fib_calls_per_ms);
    const double t0 = ThreadCpuMs();
    g_sink = recompute_stats(fib_calls);
    const double fib_ms = ThreadCpuMs() - t0;
    if (!g_fixed_work) Adapt(&t_fib_calls_per_ms, fib_calls, fib_ms);
    g_fib_us.fetch_add(static_cast<uint64_t>(fib_ms * 1e3), std::memory_order_relaxed);
    g_requests.fetch_add(1, std::memory_order_relaxed);
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
void HandleSwitch(int) { g_switched.store(true); }

// Never destroyed: destroying a condition variable with waiters blocks exit() in glibc.
std::mutex* const g_idle_mu = new std::mutex;
std::condition_variable* const g_idle_cv = new std::condition_variable;

__attribute__((noinline)) void* IdleForever(void*) {
  std::unique_lock<std::mutex> lock(*g_idle_mu);
  for (;;) g_idle_cv->wait(lock);  // never notified
  return nullptr;
}

// Threads that block forever (small stacks: hundreds of them stay cheap). Exit ends them.
bool StartIdleThreads(int n) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 << 10);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (int i = 0; i < n; ++i) {
    pthread_t t;
    if (const int err = pthread_create(&t, &attr, IdleForever, nullptr); err != 0) {
      std::fprintf(stderr, "demo_service: idle thread %d: %s\n", i, std::strerror(err));
      pthread_attr_destroy(&attr);
      return false;
    }
  }
  pthread_attr_destroy(&attr);
  return true;
}

double MonotonicSeconds() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec + now.tv_nsec / 1e9;
}

double ProcessCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return now.tv_sec + now.tv_nsec / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0, switch_after = 0, warmup = 0;
  int threads = 2, idle_threads = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--switch-after") && i + 1 < argc) {
      switch_after = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--idle-threads") && i + 1 < argc) {
      idle_threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--warmup") && i + 1 < argc) {
      warmup = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--fixed-work")) {
      g_fixed_work = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--seconds N] [--switch-after S] [--threads N] [--idle-threads N] "
                   "[--fixed-work] [--warmup W]\n",
                   argv[0]);
      return 2;
    }
  }
  if (threads < 1) threads = 1;
  if (idle_threads < 0) idle_threads = 0;
  signal(SIGTERM, HandleSignal);
  signal(SIGINT, HandleSignal);
  signal(SIGUSR1, HandleSwitch);
  Calibrate();
  if (!StartIdleThreads(idle_threads)) return 1;
  std::printf("demo_service pid %d ready\n", getpid());
  std::fflush(stdout);

  // The paths' CPU time so far (tokenize, deflate, fib), microseconds.
  struct PathTimes {
    uint64_t us[3] = {};
    static PathTimes Now() {
      return {{g_tokenize_us.load(), g_deflate_us.load(), g_fib_us.load()}};
    }
  };
  PathTimes paths_from, paths_to;
  // Requests and time at the end of the warm-up, and at the stop.
  uint64_t counted_from = 0, counted_to = 0;
  double window_start = 0, window_end = 0;
  double cpu_start = ProcessCpuSeconds(), cpu_end = 0;
  std::thread timer([&] {
    const double start = MonotonicSeconds();
    bool warm = warmup <= 0;
    window_start = start;
    while (!g_stop.load()) {
      const double now = MonotonicSeconds();
      const double elapsed = now - start;
      if (!warm && elapsed >= warmup) {
        warm = true;
        counted_from = g_requests.load();
        paths_from = PathTimes::Now();
        window_start = now;
        cpu_start = ProcessCpuSeconds();
      }
      if (switch_after > 0 && elapsed >= switch_after) g_switched.store(true);
      if (seconds > 0 && elapsed >= seconds) g_stop.store(true);
      usleep(20'000);
    }
    counted_to = g_requests.load();
    paths_to = PathTimes::Now();
    window_end = MonotonicSeconds();
    cpu_end = ProcessCpuSeconds();
    if (!warm) {  // stopped in the warm-up
      counted_from = counted_to, window_start = window_end, cpu_start = cpu_end;
      paths_from = paths_to;
    }
  });
  std::vector<std::thread> workers;
  for (int i = 1; i < threads; ++i) workers.emplace_back(serve_forever);
  serve_forever();
  for (auto& t : workers) t.join();
  timer.join();
  const double window = window_end - window_start;
  const uint64_t requests = counted_to - counted_from;
  double pct[3], paths_us = 0;
  for (int i = 0; i < 3; ++i) paths_us += paths_to.us[i] - paths_from.us[i];
  for (int i = 0; i < 3; ++i) {
    pct[i] = paths_us > 0 ? 100.0 * (paths_to.us[i] - paths_from.us[i]) / paths_us : 0.0;
  }
  std::printf(
      "demo_service done: requests=%llu seconds=%.3f requests_per_second=%.3f "
      "cpu_us_per_request=%.4f tokenize_pct=%.2f deflate_pct=%.2f fib_pct=%.2f\n",
      static_cast<unsigned long long>(requests), window, window > 0 ? requests / window : 0.0,
      requests > 0 ? (cpu_end - cpu_start) * 1e6 / requests : 0.0, pct[0], pct[1], pct[2]);
  std::fflush(stdout);
  return 0;
}
