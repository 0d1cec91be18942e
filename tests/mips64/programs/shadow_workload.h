/* The instrumented MIPS64/x86-64 test workload shared by the recorder (workload.c) and the
 * in-process sampler accuracy test (inproc_accuracy.cc): functions that keep a shadow stack of
 * their ids, so every sample has a known call chain. lib_entry/lib_leaf live in a separate
 * file (shadow_lib.c), built into a shared library in the dynamic variants. Include once per
 * program. */
#ifndef STRATA_TESTS_MIPS64_PROGRAMS_SHADOW_WORKLOAD_H_
#define STRATA_TESTS_MIPS64_PROGRAMS_SHADOW_WORKLOAD_H_
#include <alloca.h>
#include <stdlib.h>

#ifndef SHADOW_TLS
#define SHADOW_TLS __thread
#endif
#include "shadow_defs.h"

#ifndef SHADOW_LIB_CALLS
#define SHADOW_LIB_CALLS 1
#endif

long lib_entry(long n, long (*callback)(long));

SHADOW_TLS volatile int g_shadow[MAXD];
SHADOW_TLS volatile unsigned char g_tail[MAXD];
SHADOW_TLS volatile int g_depth;

static volatile long sink;

NOINLINE long leaf(long n) {
  ENTER(F_LEAF);
  unsigned long s = 0; /* unsigned: the busy work wraps (signed overflow is undefined) */
  for (long i = 0; i < n; i++) s += (unsigned long)(i * i) ^ (s >> 3);
  LEAVE();
  return (long)s;
}

NOINLINE long recurse(int n) {
  ENTER(F_RECURSE);
  long r = n <= 0 ? leaf(2000) : recurse(n - 1) + n;
  LEAVE();
  return r;
}

NOINLINE long use_alloca(int n) {
  ENTER(F_ALLOCA);
  volatile char *p = alloca(n);
  for (int i = 0; i < n; i += 64) p[i] = (char)i;
  long r = leaf(1500) + p[n / 2];
  LEAVE();
  return r;
}

NOINLINE long big_frame(int n) {
  ENTER(F_BIG);
  volatile char buf[40000]; /* > 32 KiB: li v1,N; dsubu sp,sp,v1 */
  for (int i = 0; i < (int)sizeof buf; i += 512) buf[i] = (char)(i + n);
  long r = leaf(1500) + buf[n & 1023];
  LEAVE();
  return r;
}

NOINLINE long tail_target(long n) {
  ENTER(F_TAIL_TARGET);
  long r = leaf(1000 + (n & 7));
  LEAVE();
  return r;
}

NOINLINE long tail_caller(long n) {
  ENTER(F_TAIL_CALLER);
  sink = n;
#ifdef __OPTIMIZE__
  MARK_TAIL();
  return tail_target(n + 1); /* a sibling call at -O2 and -Os */
#else
  /* -O0 makes no sibling calls: this frame stays below tail_target until it returns, so the
   * shadow stack must keep it too (marked, tail_target's exit would pop it early). */
  long r = tail_target(n + 1);
  LEAVE();
  return r;
#endif
}

NOINLINE int qsort_cmp(const void *a, const void *b) {
  ENTER(F_QSORT_CMP);
  long x = *(const long *)a, y = *(const long *)b;
  for (volatile int i = 0; i < 20; i++) {}
  LEAVE();
  return (x > y) - (x < y);
}

NOINLINE void sorter(void) {
  ENTER(F_SORTER);
  long v[64];
  for (int i = 0; i < 64; i++) v[i] = (i * 7919) % 64;
  qsort(v, 64, sizeof v[0], qsort_cmp); /* libc frames between two instrumented ones */
  LEAVE();
}

NOINLINE long epilogue_heavy(long n) {
  ENTER(F_EPILOGUE_HEAVY);
  long r = 0;
  if (n & 1) { LEAVE(); return n; } /* early exit before any call: shrink-wrapping */
  r = leaf(200) + n;
  LEAVE();
  return r;
}

NOINLINE long lib_callback(long n) {
  ENTER(F_LIB_CALLBACK);
  long r = leaf(800 + (n & 3));
  LEAVE();
  return r;
}

NOINLINE void work(int iter) {
  ENTER(F_WORK);
  sink = leaf(3000);
  sink = recurse(3 + iter % 5);
  sink = use_alloca(256 + (iter % 4) * 512);
  sink = big_frame(iter);
  sink = tail_caller(iter);
  if (iter % 4 == 0) sorter();
  for (int i = 0; i < 50; i++) sink = epilogue_heavy(i);
  /* SHADOW_LIB_CALLS > 1 (the dynamic-library variant): most of the time in the library. */
  for (int i = 0; i < SHADOW_LIB_CALLS; i++) sink = lib_entry(iter + i, lib_callback);
  LEAVE();
}

#endif
