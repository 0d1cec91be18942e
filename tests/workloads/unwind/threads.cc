// Four threads with different, stable call chains (recursion depths 5, 30, 80, 150) plus the
// main thread waiting: per-thread incremental state must not mix threads.
//   unwind_workload_threads [SECONDS]
#include <pthread.h>

#include "common.h"

namespace {

__attribute__((noinline)) uint64_t Chain(int depth, uint64_t x) {
  uint64_t r = depth <= 1 ? workload::Burn(4000 + x % 1000, x) : Chain(depth - 1, x + depth);
  return r ^ static_cast<uint64_t>(depth);
}

struct Arg {
  int depth;
  double seconds;
};

void* ThreadMain(void* p) {
  const Arg* arg = static_cast<const Arg*>(p);
  workload::Deadline deadline(arg->seconds);
  uint64_t acc = 0;
  while (!deadline.passed()) acc += Chain(arg->depth, acc);
  return reinterpret_cast<void*>(acc & 1);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = workload::Seconds(argc, argv);
  Arg args[4] = {{5, seconds}, {30, seconds}, {80, seconds}, {150, seconds}};
  pthread_t threads[4];
  for (int i = 0; i < 4; ++i) pthread_create(&threads[i], nullptr, ThreadMain, &args[i]);
  for (pthread_t t : threads) pthread_join(t, nullptr);
  return 0;
}
