/* MIPS64 end-to-end workload: burns CPU for argv[1] seconds (default 20), about 90 % of it on
 * the path main > run > hot_path > hot_leaf and the rest in main > run > cold_leaf. Linked
 * with the in-process sampler (strata_inproc_static), which publishes its stacks in a ring
 * under $STRATA_INPROC_DIR for strata-agent. Prints "ready" once it runs. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define NOINLINE __attribute__((noinline, noclone))

static volatile unsigned long sink;

NOINLINE unsigned long hot_leaf(unsigned long n) {
  unsigned long s = 0;
  for (unsigned long i = 0; i < n; i++) s += (i * i) ^ (s >> 3);
  sink = s;
  return s;
}

NOINLINE unsigned long hot_path(unsigned long n) { return hot_leaf(n) + 1; }

NOINLINE unsigned long cold_leaf(unsigned long n) {
  unsigned long s = 1;
  for (unsigned long i = 0; i < n; i++) s = s * 31 + (i ^ (s >> 7));
  sink = s;
  return s;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

NOINLINE void run(double seconds) {
  const double end = now_s() + seconds;
  while (now_s() < end) {
    for (int k = 0; k < 9; k++) hot_path(20000);
    cold_leaf(20000);
  }
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 20;
  printf("ready\n");
  fflush(stdout);
  run(seconds);
  return 0;
}
