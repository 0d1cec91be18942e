// Workload of source_lines_test, compiled at -O2 -g (DWARF 4 and 5): always-inline helpers
// nested three deep (Upper -> Middle -> HeaderLeaf, the last in a header) inside the noinline
// InlineWorkloadOuter, whose addresses the test symbolizes and compares with addr2line; and
// out-of-line functions DWARF gives no linkage name (an anonymous namespace's, a lambda's,
// which gcc describes inside the enclosing function's DIE).
// The test finds the declaration and call lines by searching this file: edit freely.
#include "server/symbolize/testdata/inline_workload.h"

namespace strata_inline_workload {
namespace {

__attribute__((always_inline)) inline unsigned Middle(volatile unsigned* sink, unsigned x) {
  const unsigned a = HeaderLeaf(sink, x);
  *sink = a + 1;
  return a + HeaderLeaf(sink, x + 7);
}

__attribute__((always_inline)) inline unsigned Upper(volatile unsigned* sink, unsigned x) {
  unsigned r = Middle(sink, x);
  for (unsigned i = 0; i < (x & 7); ++i) r += Middle(sink, r + i);
  return r;
}

__attribute__((noinline)) unsigned Checksum(volatile unsigned* sink, unsigned n) {
  auto step = [sink](unsigned x) __attribute__((noinline)) {
    *sink = x;
    return x * 31u + 7u;
  };
  unsigned c = 0;
  for (unsigned i = 0; i < n; ++i) c = step(c ^ i);
  return c;
}

}  // namespace

__attribute__((noinline)) unsigned InlineWorkloadOuter(volatile unsigned* sink, unsigned n) {
  unsigned total = 0;
  for (unsigned i = 0; i < n; ++i) total += Upper(sink, i);
  *sink = total;
  return total;
}

}  // namespace strata_inline_workload

int main(int argc, char** argv) {
  volatile unsigned sink = 0;
  const unsigned n = static_cast<unsigned>(argc) * 1000u;
  const unsigned outer = strata_inline_workload::InlineWorkloadOuter(&sink, n);
  return static_cast<int>((outer ^ strata_inline_workload::Checksum(&sink, n)) & 1u);
}
