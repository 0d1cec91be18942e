/* Shadow-stack vocabulary shared by the workload programs and shadow_lib.c: function ids
 * (the host tests map symbol names to the same ids), the per-thread shadow stack and the
 * ENTER/LEAVE/MARK_TAIL macros. A function about to tail-call marks its entry so the callee's
 * exit pops both (the tail caller's hardware frame is gone: unwinders cannot see it). */
#ifndef STRATA_TESTS_MIPS64_PROGRAMS_SHADOW_DEFS_H_
#define STRATA_TESTS_MIPS64_PROGRAMS_SHADOW_DEFS_H_
#ifndef SHADOW_TLS
#define SHADOW_TLS __thread
#endif
#define NOINLINE __attribute__((noinline))
#define MAXD 128

/* Function ids; the x86-64 test maps symbol names to the same ids (kNames there). */
enum { F_MAIN, F_WORK, F_LEAF, F_RECURSE, F_ALLOCA, F_BIG, F_TAIL_CALLER, F_TAIL_TARGET,
       F_QSORT_CMP, F_SORTER, F_EPILOGUE_HEAVY, F_LIB_ENTRY, F_LIB_LEAF, F_LIB_CALLBACK,
       F_THREAD_MAIN };

/* Per thread: the in-process sampler test runs the workload on two threads. */
extern SHADOW_TLS volatile int g_shadow[MAXD];
extern SHADOW_TLS volatile unsigned char g_tail[MAXD];
extern SHADOW_TLS volatile int g_depth;

#define ENTER(id) do { g_shadow[g_depth] = (id); g_tail[g_depth] = 0; g_depth = g_depth + 1; } while (0)
#define LEAVE() do { int d_ = g_depth - 1; while (d_ > 0 && g_tail[d_ - 1]) d_--; g_depth = d_; } while (0)
#define MARK_TAIL() (g_tail[g_depth - 1] = 1)

#endif
