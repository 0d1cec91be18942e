// Deep recursion: a 200-frame recursive chain whose leaf burns CPU, rebuilt continuously.
//   unwind_workload_deep_recursion [SECONDS]
#include "common.h"

namespace {

__attribute__((noinline)) uint64_t Recurse(int depth, uint64_t acc) {
  uint64_t r = depth <= 1 ? workload::Burn(20000, acc) : Recurse(depth - 1, acc * 31 + depth);
  return r ^ static_cast<uint64_t>(depth);  // not a tail call
}

}  // namespace

int main(int argc, char** argv) {
  workload::Deadline deadline(workload::Seconds(argc, argv));
  uint64_t acc = 1;
  while (!deadline.passed()) {
    for (int i = 0; i < 50; ++i) acc += Recurse(200, acc);
  }
  return static_cast<int>(acc & 1);
}
