// Most of the time inside a signal handler: a SIGALRM (ITIMER_REAL) whose handler burns CPU
// under a 10-frame handler chain for 2.5 ms of the thread's CPU time per delivery, then arms
// the next alarm 0.5 to 2.5 ms later at random (the rest lets the main chain be sampled too),
// interrupting a 30-frame main chain that burns CPU in short calls (so the interrupted pc
// lands anywhere: in the leaf, in the chain's frames between calls, at function entries).
// Samples taken in the handler unwind through __restore_rt's signal frame into the
// interrupted chain.
//
// The handler's budget is CPU time, not a count of iterations: a fixed amount of work would
// give the handler a share that depends on the machine's speed. With CPU time the handler
// holds about 2.5 / 4 of the thread's CPU whatever the speed or load. The gap is random
// because a fixed 4 ms cycle ran in step with a 499 Hz sampler (2.004 ms): for a whole
// recording the samples fell on the same part of every cycle, and the handler's share of them
// came out anywhere from 12 % to 100 %.
//   unwind_workload_signal_handler [SECONDS]
#include <signal.h>
#include <sys/time.h>
#include <time.h>

#include "common.h"

namespace {

constexpr int kHandlerDepth = 10;
constexpr int kMainDepth = 30;

__attribute__((noinline)) uint64_t HandlerChain(int depth, uint64_t x) {
  uint64_t r = depth <= 1 ? workload::Burn(40000, x) : HandlerChain(depth - 1, x * 5 + 1);
  return r + static_cast<uint64_t>(depth);  // not a tail call
}

int64_t ThreadCpuNs() {
  timespec ts;  // clock_gettime is async-signal-safe
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Arms the one next SIGALRM `us` microseconds from now (setitimer is async-signal-safe).
void ArmAlarm(long us) {
  itimerval timer = {};
  timer.it_value.tv_usec = us;
  setitimer(ITIMER_REAL, &timer, nullptr);
}

__attribute__((noinline)) void OnAlarm(int) {
  static uint64_t x = 7;
  static uint64_t random = 0x9e3779b97f4a7c15ull;
  constexpr int64_t kBudgetNs = 2'500'000;
  // Many short leaf calls per delivery, so the handler's own frames are sampled between them.
  const int64_t start = ThreadCpuNs();
  do {
    x = HandlerChain(kHandlerDepth, x);
  } while (ThreadCpuNs() - start < kBudgetNs);
  random ^= random << 13;  // xorshift64
  random ^= random >> 7;
  random ^= random << 17;
  ArmAlarm(500 + static_cast<long>(random % 2001));
}

__attribute__((noinline)) uint64_t MainChain(int depth, uint64_t x) {
  uint64_t r = depth <= 1 ? workload::Burn(50 + (x & 255), x) : MainChain(depth - 1, x * 3 + 1);
  return r ^ static_cast<uint64_t>(depth);
}

}  // namespace

int main(int argc, char** argv) {
  workload::Deadline deadline(workload::Seconds(argc, argv));
  struct sigaction action = {};
  action.sa_handler = OnAlarm;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &action, nullptr);
  ArmAlarm(4000);
  uint64_t acc = 1;
  while (!deadline.passed()) {
    for (int i = 0; i < 1000; ++i) acc += MainChain(kMainDepth, acc);
  }
  return static_cast<int>(acc & 1);
}
