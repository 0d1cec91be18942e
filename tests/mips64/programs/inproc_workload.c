/* Workload for the in-process sampler accuracy test: the shadow-stack workload on the main
 * thread and on a second thread (created after the sampler started, so it exercises thread
 * registration), with a sampler hook that records each unwound stack next to the sampled
 * thread's shadow stack. Built at -O0/-O2/-Os, with and without frame pointers, with the
 * sampler linked in (static) or preloaded (libstrata_inproc.so, lib part in a shared library).
 *
 * Usage: inproc_workload [samples]  (default 2500). Exit status from the analysis. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "shadow_workload.h"

#define MAX_RECORDS 8192
#define MAX_PCS 126

struct Record {
  uint64_t pcs[MAX_PCS];
  int32_t num_pcs, truncated, depth;
  int32_t ids[MAXD];
  uint8_t tail[MAXD];
};

struct Record g_records[MAX_RECORDS];
volatile int g_num_records;
static volatile int g_collect = 1, g_stop;
static int g_limit = 2500;

/* Called by the sampler in signal context (async-signal-safe: plain copies). */
void strata_inproc_on_sample(const uint64_t *pcs, size_t n, int truncated) {
  if (!g_collect) return;
  int i = __atomic_fetch_add(&g_num_records, 1, __ATOMIC_RELAXED);
  if (i >= MAX_RECORDS || i >= g_limit) return;
  struct Record *r = &g_records[i];
  r->num_pcs = (int32_t)(n < MAX_PCS ? n : MAX_PCS);
  memcpy(r->pcs, pcs, (size_t)r->num_pcs * sizeof(uint64_t));
  r->truncated = truncated;
  r->depth = g_depth;
  for (int k = 0; k < r->depth && k < MAXD; k++) { r->ids[k] = g_shadow[k]; r->tail[k] = g_tail[k]; }
}

NOINLINE void *thread_main(void *arg) {
  (void)arg;
  ENTER(F_THREAD_MAIN);
  for (int iter = 1; !g_stop; iter++) work(iter);
  LEAVE();
  return NULL;
}

/* inproc_accuracy.cc */
int strata_analyze_records(const struct Record *records, int n, int limit, double seconds);

int main(int argc, char **argv) {
  ENTER(F_MAIN);
  if (argc > 1) g_limit = atoi(argv[1]);
  if (g_limit > MAX_RECORDS) g_limit = MAX_RECORDS;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pthread_t thread;
  pthread_create(&thread, NULL, thread_main, NULL);
  for (int iter = 0; g_num_records < g_limit; iter++) {
    work(iter);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (t1.tv_sec - t0.tv_sec > 100) break; /* keep the test bounded */
  }
  g_stop = 1;
  pthread_join(thread, NULL);
  g_collect = 0;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  int n = g_num_records < g_limit ? g_num_records : g_limit;
  int rc = strata_analyze_records(g_records, n, g_limit,
                                  (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
  LEAVE();
  return rc;
}
