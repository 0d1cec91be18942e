// Workload of debuginfo_e2e_test: a hot loop whose work is inlined two levels deep
// (Spin -> Scale -> Mix, both always_inline) inside the noinline Spin, built at -O2 -g. The
// test compares the server's lines for its samples with addr2line -i on the same binary.
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

int main() {
  std::printf("ready\n");
  std::fflush(stdout);
  const auto stop = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < stop) g_sink = Spin(1u << 20);
  return 0;
}
