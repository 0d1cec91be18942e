// blocking_service: threads that wait as much as they compute, with known places for each, for
// tests of off-CPU profiles and kernel frames.
//
//   --mode half-sleep   each thread alternates burn_cpu (--burn-ms of CPU) and
//                       nap_in_known_place (nanosleep of --nap-ms): about half of its wall
//                       time on CPU in burn_cpu, half blocked in nap_in_known_place.
//   --mode syscalls     each thread calls read_zeros: read(2) of /dev/zero in 64 KiB chunks,
//                       so most of its CPU time is in the kernel below read_zeros.
//   --mode lock-heavy   --threads threads take one mutex in contend_lock, hold it for about
//                       --burn-ms of CPU and release it: they wait on the lock
//                       (futex) most of the time.
//
// Flags: --threads N (default 1), --seconds S (default: until killed), --burn-ms, --nap-ms.
// At exit prints, per mode, the ground truth the tests compare with:
//   blocking_service done: wall_ms=W burn_ms=B burn_wall_ms=BW nap_ms=N lock_wait_ms=L threads=T
// where the others are summed over the threads: thread CPU time in burn_cpu, wall time in
// burn_cpu (more than its CPU time when the thread was preempted), wall time in
// nap_in_known_place, wall time waiting for the mutex.
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

std::atomic<bool> g_stop{false};
std::atomic<uint64_t> g_burn_ns{0};
std::atomic<uint64_t> g_burn_wall_ns{0};
std::atomic<uint64_t> g_nap_ns{0};
std::atomic<uint64_t> g_lock_wait_ns{0};
volatile uint64_t g_sink;
std::mutex g_lock;

uint64_t Now(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

extern "C" {

__attribute__((noinline)) void burn_cpu(double ms) {
  const uint64_t wall_start = Now(CLOCK_MONOTONIC);
  const uint64_t start = Now(CLOCK_THREAD_CPUTIME_ID);
  const uint64_t end = start + static_cast<uint64_t>(ms * 1e6);
  uint64_t x = g_sink;
  while (Now(CLOCK_THREAD_CPUTIME_ID) < end) {
    for (int i = 0; i < 1000; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
  }
  g_sink = x;
  g_burn_ns += Now(CLOCK_THREAD_CPUTIME_ID) - start;
  g_burn_wall_ns += Now(CLOCK_MONOTONIC) - wall_start;
}

__attribute__((noinline)) void nap_in_known_place(double ms) {
  const uint64_t start = Now(CLOCK_MONOTONIC);
  timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>(ms * 1e6) % 1'000'000'000};
  nanosleep(&ts, nullptr);
  g_nap_ns += Now(CLOCK_MONOTONIC) - start;
}

__attribute__((noinline)) void read_zeros(int fd) {
  static thread_local char buffer[1 << 16];
  for (int i = 0; i < 16; ++i) {
    if (read(fd, buffer, sizeof(buffer)) < 0) std::abort();
  }
  g_sink = g_sink + static_cast<uint8_t>(buffer[7]);
}

__attribute__((noinline)) void contend_lock(double ms) {
  const uint64_t start = Now(CLOCK_MONOTONIC);
  std::lock_guard<std::mutex> hold(g_lock);
  g_lock_wait_ns += Now(CLOCK_MONOTONIC) - start;
  burn_cpu(ms);
}

__attribute__((noinline)) void run_thread(const char* mode, double burn_ms, double nap_ms) {
  const int zero = open("/dev/zero", O_RDONLY);
  if (zero < 0) std::abort();
  while (!g_stop.load(std::memory_order_relaxed)) {
    if (std::strcmp(mode, "half-sleep") == 0) {
      burn_cpu(burn_ms);
      nap_in_known_place(nap_ms);
    } else if (std::strcmp(mode, "syscalls") == 0) {
      read_zeros(zero);
    } else {
      contend_lock(burn_ms);
    }
  }
  close(zero);
}

}  // extern "C"

int main(int argc, char** argv) {
  std::string mode = "half-sleep";
  int threads = 1;
  double seconds = 0;
  double burn_ms = 10;
  double nap_ms = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--mode") {
      mode = value;
    } else if (flag == "--threads") {
      threads = std::atoi(value);
    } else if (flag == "--seconds") {
      seconds = std::atof(value);
    } else if (flag == "--burn-ms") {
      burn_ms = std::atof(value);
    } else if (flag == "--nap-ms") {
      nap_ms = std::atof(value);
    } else {
      std::fprintf(stderr, "blocking_service: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (mode != "half-sleep" && mode != "syscalls" && mode != "lock-heavy") {
    std::fprintf(stderr, "blocking_service: --mode half-sleep|syscalls|lock-heavy\n");
    return 2;
  }
  signal(SIGTERM, [](int) { g_stop = true; });
  signal(SIGINT, [](int) { g_stop = true; });
  const uint64_t start = Now(CLOCK_MONOTONIC);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back(run_thread, mode.c_str(), burn_ms, nap_ms);
  }
  while (!g_stop && (seconds <= 0 || Now(CLOCK_MONOTONIC) - start < seconds * 1e9)) {
    usleep(10000);
  }
  g_stop = true;
  for (std::thread& w : workers) w.join();
  std::printf(
      "blocking_service done: wall_ms=%.0f burn_ms=%.0f burn_wall_ms=%.0f nap_ms=%.0f "
      "lock_wait_ms=%.0f threads=%d\n",
      (Now(CLOCK_MONOTONIC) - start) / 1e6, g_burn_ns / 1e6, g_burn_wall_ns / 1e6,
      g_nap_ns / 1e6, g_lock_wait_ns / 1e6, threads);
  return 0;
}
