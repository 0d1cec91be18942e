// Workload of debuginfo_e2e_test, built at -O2 -g: a hot loop inlined two levels deep in the
// noinline Spin (Scale -> Mix, always_inline), called from code inlined into main (Round).
// The test compares the server's leaf and call-site lines with addr2line -i on this binary.
// Prints "ready", then spins until killed (at most 300 s).
#include <chrono>
#include <cstdio>

static volatile unsigned g_sink;

__attribute__((always_inline)) static inline unsigned Mix(unsigned x) {
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  return x ^ (x >> 15);
}

__attribute__((always_inline)) static inline unsigned Scale(unsigned x) {
  unsigned r = Mix(x);
  r += Mix(r + 7) * 3;
  return r;
}

__attribute__((noinline)) static unsigned Spin(unsigned n) {
  unsigned total = 0;
  for (unsigned i = 0; i < n; ++i) total += Scale(i ^ total);
  return total;
}

// Its call of Spin is a call site inside inlined code: the site's lines are a chain too.
__attribute__((always_inline)) static inline void Round() { g_sink = Spin(1u << 20); }

int main() {
  std::printf("ready\n");
  std::fflush(stdout);
  const auto stop = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < stop) Round();
  return 0;
}
