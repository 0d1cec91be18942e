// A process with many threads that sleep and one that spins: each thread costs the agent a
// perf ring buffer (locked memory), so this is what needs CAP_IPC_LOCK, at little CPU.
//   strata_idle_threads THREADS SECONDS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {
volatile unsigned long g_sink;
// Busy about a fifth of the time: samples arrive, the test machine stays usable.
__attribute__((noinline)) void spin_forever() {
  for (;;) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
    for (unsigned long i = 0; std::chrono::steady_clock::now() < until; ++i) g_sink = i;
    std::this_thread::sleep_for(std::chrono::milliseconds(8));
  }
}
}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 100;
  const int seconds = argc > 2 ? std::atoi(argv[2]) : 60;
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([seconds] { std::this_thread::sleep_for(std::chrono::seconds(seconds)); });
  }
  std::thread([] { spin_forever(); }).detach();
  std::printf("ready %d threads\n", threads + 2);
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  std::_Exit(0);
}
