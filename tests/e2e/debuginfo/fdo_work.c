/* Workload of the FDO round trip (debuginfo_e2e_test, tests/bench/fdo): a hot loop with a
 * skewed branch and a call that the compiler may inline, built by the test with clang.
 *   fdo_work            prints "ready", then runs until killed (at most 300 s)
 *   fdo_work --bench S  runs S seconds and prints "ops/s N" */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile unsigned sink;

static unsigned rare_path(unsigned x) {
  for (int i = 0; i < 32; ++i) x = x * 2654435761u + (unsigned)i;
  return x;
}

__attribute__((noinline)) unsigned checksum(const unsigned char* data, unsigned n) {
  unsigned h = 2166136261u;
  for (unsigned i = 0; i < n; ++i) {
    if (data[i] == 0xff) h = rare_path(h); /* about 1 in 256 bytes */
    else h = (h ^ data[i]) * 16777619u;
  }
  return h;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  static unsigned char data[4096];
  unsigned seed = 1;
  for (unsigned i = 0; i < sizeof data; ++i) data[i] = (unsigned char)((seed = seed * 1103515245u + 12345u) >> 16);
  const int bench = argc == 3 && strcmp(argv[1], "--bench") == 0;
  const double seconds = bench ? atof(argv[2]) : 300;
  if (!bench) {
    printf("ready\n");
    fflush(stdout);
  }
  const double start = now();
  unsigned long ops = 0;
  while (now() - start < seconds) {
    for (int k = 0; k < 64; ++k, ++ops) sink = checksum(data, sizeof data);
  }
  if (bench) printf("ops/s %.0f\n", (double)ops / (now() - start));
  return 0;
}
