// A call tree whose leaves change all the time under 40 outer frames that stay: the outer
// chain descends once and then loops over a varying subtree (depths 1-6, eight different
// leaf functions).
//   unwind_workload_call_tree [SECONDS]
#include "common.h"

namespace {

using Leaf = uint64_t (*)(uint64_t);
#define STRATA_LEAF(n) \
  __attribute__((noinline)) uint64_t Leaf##n(uint64_t x) { return workload::Burn(300 + 37 * n, x + n); }
STRATA_LEAF(0) STRATA_LEAF(1) STRATA_LEAF(2) STRATA_LEAF(3)
STRATA_LEAF(4) STRATA_LEAF(5) STRATA_LEAF(6) STRATA_LEAF(7)
constexpr Leaf kLeaves[8] = {Leaf0, Leaf1, Leaf2, Leaf3, Leaf4, Leaf5, Leaf6, Leaf7};

__attribute__((noinline)) uint64_t Branch(int depth, uint64_t x) {
  uint64_t r = depth <= 0 ? kLeaves[x % 8](x) : Branch(depth - 1, x * 7 + 3);
  return r + static_cast<uint64_t>(depth);
}

__attribute__((noinline)) uint64_t Subtrees(const workload::Deadline& deadline) {
  uint64_t x = 12345, acc = 0;
  while (!deadline.passed()) {
    for (int i = 0; i < 200; ++i) {
      x = x * 2862933555777941757ull + 3037000493ull;
      acc += Branch(static_cast<int>((x >> 33) % 6), x >> 8);
    }
  }
  return acc;
}

__attribute__((noinline)) uint64_t Outer(int depth, const workload::Deadline& deadline) {
  uint64_t r = depth <= 1 ? Subtrees(deadline) : Outer(depth - 1, deadline);
  return r * 3 + static_cast<uint64_t>(depth);
}

}  // namespace

int main(int argc, char** argv) {
  workload::Deadline deadline(workload::Seconds(argc, argv));
  return static_cast<int>(Outer(40, deadline) & 1);
}
