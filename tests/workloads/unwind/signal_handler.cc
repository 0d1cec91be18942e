// Most of the time inside a signal handler: a periodic SIGALRM (ITIMER_REAL, every 4 ms)
// whose handler burns CPU under a 10-frame handler chain for about two thirds of each period
// (the rest lets the main chain be sampled too), interrupting a 30-frame
// main chain that burns CPU in short calls (so the interrupted pc lands anywhere: in the leaf,
// in the chain's frames between calls, at function entries). Samples taken in the handler
// unwind through __restore_rt's signal frame into the interrupted chain.
//   unwind_workload_signal_handler [SECONDS]
#include <signal.h>
#include <sys/time.h>

#include "common.h"

namespace {

constexpr int kHandlerDepth = 10;
constexpr int kMainDepth = 30;

__attribute__((noinline)) uint64_t HandlerChain(int depth, uint64_t x) {
  uint64_t r = depth <= 1 ? workload::Burn(400000, x) : HandlerChain(depth - 1, x * 5 + 1);
  return r + static_cast<uint64_t>(depth);  // not a tail call
}

__attribute__((noinline)) void OnAlarm(int) {
  static uint64_t x = 7;
  // Several leaf calls per delivery so the handler's own frames are sampled between them.
  // The count sets the handler's share of the time (8 would leave no time to the main chain).
  for (int i = 0; i < 3; ++i) x = HandlerChain(kHandlerDepth, x);
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
  itimerval timer = {};
  timer.it_interval.tv_usec = 4000;
  timer.it_value.tv_usec = 4000;
  setitimer(ITIMER_REAL, &timer, nullptr);
  uint64_t acc = 1;
  while (!deadline.passed()) {
    for (int i = 0; i < 1000; ++i) acc += MainChain(kMainDepth, acc);
  }
  return static_cast<int>(acc & 1);
}
