/* The sampler of the MIPS64 Go test, linked into the Go workload (cgo) and run with it under
 * qemu-mips64el, where there are no perf events: per-thread CPU-time timers raise SIGUSR2, and
 * the handler records what perf would -- the interrupted registers and a copy of the stack
 * from sp up -- for the host to unwind with Strata's unwinder. Nothing is unwound here.
 *
 * Threads: every Go thread (M) of a cgo program is made by pthread_create (runtime/cgo), which
 * the link wraps (-Wl,--wrap=pthread_create) so each new thread is known from its first
 * instruction; the main thread is the process itself. Timers run between
 * strata_recorder_start() and strata_recorder_stop().
 *
 * The copy's top: a goroutine's stack is Go heap, not a thread stack, so its end is read from
 * the goroutine itself (g, in register $30 in Go code; g.stack {lo, hi} is g's first field),
 * after checking that g lies in readable memory (a snapshot of /proc/self/maps) and that its
 * stack holds sp. Otherwise (C code that reused $30) the copy ends at the end of sp's mapping,
 * at most kFallbackCopy bytes up.
 *
 * Go owns signals: its handlers are installed for every signal at start-up and it forwards
 * none of SIGUSR2, so the handler is installed after the runtime's (from a package init
 * function), with SA_ONSTACK (Go threads run signal handlers on their signal stacks) and with
 * SIGPROF blocked while it runs (Go's own profiler then samples the interrupted code, not this
 * handler).
 *
 * The runtime's memory the host's stack crossings read (agent/golang's GoroutineStacks, as
 * the agent reads it from a live target), taken at the sample, when STRATA_GO_RECORD_LAYOUT
 * gives the offsets of that code's RuntimeLayout ("g_stack_hi,g_m,g_sched_sp,g_size,m_g0,
 * m_curg,stack_bytes"), starting from the sample's g (checked as above): that g, its m up to
 * m.curg, and of m.g0 and m.curg the one that is not the sample's g, its g and its stack from
 * its saved sp, at most stack_bytes up (the crossing's own read: on g0, systemstack, mcall and
 * cgo calls go on at curg's saved state; a Go callback from C goes on at g0's).
 *
 * File: records (struct record, the stack bytes padded to 8, then memory_size bytes of memory
 * regions: a struct region and its bytes padded to 8 each), then an end record (magic
 * kEndMagic, tid = the number of records, flags = records dropped for space). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define kSampleMagic 0x504d53474f525453ull /* "STRGOSMP" */
#define kEndMagic 0x444e45474f525453ull    /* "STRGOEND" */
#define kArenaBytes (256ul << 20)
#define kFallbackCopy (32ul << 10)
#define kMaxCopy (1ul << 20)
#define kMaxThreads 512
#define kMaxMaps 4096
#define kMaxMemory (80ul << 10)

struct record {
  uint64_t magic;
  uint32_t tid;
  uint32_t flags;  /* 1: the copy ends at the top of g's stack */
  uint64_t pc;
  uint64_t gregs[32];
  uint64_t stack_start;
  uint64_t stack_size;
  uint64_t memory_size;
};

struct region {
  uint64_t start;
  uint64_t size;
};

struct layout {
  uint64_t g_stack_hi, g_m, g_sched_sp, g_size, m_g0, m_curg, stack_bytes;
};

struct range {
  uint64_t start, end;
};
struct maps {
  size_t n;
  struct range r[kMaxMaps];
};

static char *g_path;
static long g_period_ns;
static uint8_t *g_arena;
static atomic_size_t g_used;
static atomic_uint g_dropped;
static atomic_uint g_overruns;  /* timer expirations merged into a pending signal */
static struct maps g_maps[2];
static atomic_int g_current_maps;
static atomic_int g_recording;
static struct layout g_layout;
static int g_have_layout;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  pid_t tid;
  int armed;
  timer_t timer;
} g_threads[kMaxThreads];
static int g_num_threads;
static int g_timer_failures;  /* timer_create failed: the thread had exited, or no timer left */

static pid_t tid_now(void) { return (pid_t)syscall(SYS_gettid); }

/* The end of the readable mapping holding addr, or 0. */
static uint64_t readable_end(uint64_t addr) {
  const struct maps *m = &g_maps[atomic_load_explicit(&g_current_maps, memory_order_acquire)];
  size_t lo = 0, hi = m->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (m->r[mid].start <= addr) lo = mid + 1; else hi = mid;
  }
  return lo > 0 && addr < m->r[lo - 1].end ? m->r[lo - 1].end : 0;
}

static void read_maps(struct maps *out) {
  out->n = 0;
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == NULL) return;
  char line[512];
  while (out->n < kMaxMaps && fgets(line, sizeof line, f) != NULL) {
    unsigned long start, end;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &start, &end, perms) != 3 || perms[0] != 'r') continue;
    /* Adjacent readable mappings merge: a copy may run across them. */
    if (out->n > 0 && out->r[out->n - 1].end == start) {
      out->r[out->n - 1].end = end;
    } else {
      out->r[out->n].start = start;
      out->r[out->n].end = end;
      out->n++;
    }
  }
  fclose(f);
}

/* The handler reads the current snapshot; the other one is rewritten, 200 ms after it was
 * last current (a handler runs for microseconds). */
static void *refresh_maps(void *unused) {
  (void)unused;
  for (;;) {
    const struct timespec pause = {0, 200 * 1000 * 1000};
    nanosleep(&pause, NULL);
    const int next = 1 - atomic_load(&g_current_maps);
    read_maps(&g_maps[next]);
    atomic_store_explicit(&g_current_maps, next, memory_order_release);
  }
  return NULL;
}

static uint64_t word_at(uint64_t addr) { return *(const uint64_t *)addr; }

/* Appends [start, start + size) as a region at *at, when readable and within `end`. */
static void add_region(uint64_t start, uint64_t size, uint8_t *base, size_t *at, size_t end) {
  if (start == 0 || start % 8 != 0 || readable_end(start) < start + size) return;
  const size_t bytes = sizeof(struct region) + ((size + 7) & ~(size_t)7);
  if (*at + bytes > end) return;
  struct region *r = (struct region *)(base + *at);
  r->start = start;
  r->size = size;
  memcpy(r + 1, (const void *)start, size);
  *at += bytes;
}

/* The regions of the g `g` is (already checked readable) -- see the top of the file. */
static size_t add_runtime_memory(uint64_t g, uint8_t *base, size_t end) {
  const struct layout *l = &g_layout;
  size_t at = 0;
  add_region(g, l->g_size, base, &at, end);
  const uint64_t m = word_at(g + l->g_m);
  if (m == 0 || m % 8 != 0 || readable_end(m) < m + l->m_curg + 8) return at;
  add_region(m, l->m_curg + 8, base, &at, end);
  const uint64_t others[2] = {word_at(m + l->m_g0), word_at(m + l->m_curg)};
  for (int i = 0; i < 2; i++) {
    const uint64_t other = others[i];
    if (other == g || other == 0 || other % 8 != 0 || readable_end(other) < other + l->g_size) {
      continue;
    }
    add_region(other, l->g_size, base, &at, end);
    const uint64_t sp = word_at(other + l->g_sched_sp), hi = word_at(other + l->g_stack_hi);
    if (sp != 0 && sp < hi) {
      add_region(sp, hi - sp < l->stack_bytes ? hi - sp : l->stack_bytes, base, &at, end);
    }
  }
  return at;
}

static void on_sample(int sig, siginfo_t *info, void *context) {
  (void)sig;
  const int saved_errno = errno;
  if (info->si_code == SI_TIMER) atomic_fetch_add(&g_overruns, (unsigned)info->si_overrun);
  const ucontext_t *uc = context;
  const uint64_t sp = uc->uc_mcontext.gregs[29];
  const uint64_t g = uc->uc_mcontext.gregs[30];
  uint64_t top = 0;
  uint32_t flags = 0;
  if (g % 8 == 0 && readable_end(g) >= g + 16) {
    const uint64_t lo = ((const uint64_t *)g)[0], hi = ((const uint64_t *)g)[1];
    if (lo <= sp && sp < hi && hi - sp <= kMaxCopy && readable_end(sp) >= hi) {
      top = hi;
      flags = 1;
    }
  }
  if (top == 0) {
    const uint64_t end = readable_end(sp);
    top = end == 0 ? sp : (end - sp > kFallbackCopy ? sp + kFallbackCopy : end);
  }
  const size_t size = (size_t)(top - sp);
  const size_t stack_bytes = sizeof(struct record) + ((size + 7) & ~(size_t)7);
  /* The runtime's memory goes to this thread's scratch area first: its size is known only
   * after the copy. */
  static __thread uint8_t scratch[kMaxMemory];
  size_t memory = 0;
  if (g_have_layout && flags == 1 && readable_end(g) >= g + g_layout.g_size) {
    memory = add_runtime_memory(g, scratch, sizeof scratch);
  }
  const size_t bytes = stack_bytes + memory;
  const size_t at = atomic_fetch_add(&g_used, bytes);
  if (at + bytes > kArenaBytes) {
    atomic_fetch_add(&g_dropped, 1);
  } else {
    struct record *r = (struct record *)(g_arena + at);
    r->tid = (uint32_t)tid_now();
    r->flags = flags;
    r->pc = uc->uc_mcontext.pc;
    for (int i = 0; i < 32; i++) r->gregs[i] = uc->uc_mcontext.gregs[i];
    r->stack_start = sp;
    r->stack_size = size;
    r->memory_size = memory;
    memcpy(r + 1, (const void *)sp, size);
    memcpy(g_arena + at + stack_bytes, scratch, memory);
    atomic_store_explicit((_Atomic uint64_t *)&r->magic, kSampleMagic, memory_order_release);
  }
  errno = saved_errno;
}

/* Caller holds g_mu. The timer counts the thread's CPU time (its CPU clock id, as
 * pthread_getcpuclockid makes it) and signals that thread. */
static void arm_locked(int i) {
  if (g_threads[i].armed) return;
  const pid_t tid = g_threads[i].tid;
  const clockid_t clock = (clockid_t)((~(unsigned)tid << 3) | 6);
  struct sigevent sev;
  memset(&sev, 0, sizeof sev);
  sev.sigev_notify = SIGEV_THREAD_ID;
  sev.sigev_signo = SIGUSR2;
  sev._sigev_un._tid = tid;
  if (timer_create(clock, &sev, &g_threads[i].timer) != 0) {
    g_timer_failures++;
    return;
  }
  struct itimerspec its;
  its.it_interval.tv_sec = 0;
  its.it_interval.tv_nsec = g_period_ns;
  its.it_value = its.it_interval;
  timer_settime(g_threads[i].timer, 0, &its, NULL);
  g_threads[i].armed = 1;
}

static void add_thread(pid_t tid) {
  pthread_mutex_lock(&g_mu);
  if (g_num_threads < kMaxThreads) {
    g_threads[g_num_threads].tid = tid;
    g_threads[g_num_threads].armed = 0;
    if (atomic_load(&g_recording)) arm_locked(g_num_threads);
    g_num_threads++;
  }
  pthread_mutex_unlock(&g_mu);
}

struct start_args {
  void *(*start)(void *);
  void *arg;
};

static void *registered_start(void *p) {
  struct start_args args = *(struct start_args *)p;
  free(p);
  add_thread(tid_now());
  return args.start(args.arg);
}

int __real_pthread_create(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

int __wrap_pthread_create(pthread_t *thread, const pthread_attr_t *attr,
                          void *(*start)(void *), void *arg) {
  struct start_args *args = malloc(sizeof *args);
  if (args == NULL) return EAGAIN;
  args->start = start;
  args->arg = arg;
  const int rc = __real_pthread_create(thread, attr, registered_start, args);
  if (rc != 0) free(args);
  return rc;
}

int strata_recorder_init(const char *path, int hz) {
  g_path = strdup(path);
  g_period_ns = 1000000000L / (hz > 0 ? hz : 250);
  const char *layout = getenv("STRATA_GO_RECORD_LAYOUT");
  if (layout != NULL) {
    struct layout *l = &g_layout;
    g_have_layout = sscanf(layout, "%lu,%lu,%lu,%lu,%lu,%lu,%lu", &l->g_stack_hi, &l->g_m,
                           &l->g_sched_sp, &l->g_size, &l->m_g0, &l->m_curg,
                           &l->stack_bytes) == 7 &&
                    l->g_size <= 4096 && l->m_curg <= 4096 && l->stack_bytes <= (64ul << 10);
    if (!g_have_layout) return -1;
  }
  g_arena = mmap(NULL, kArenaBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (g_arena == MAP_FAILED) return -1;
  read_maps(&g_maps[0]);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sample;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGPROF);
  if (sigaction(SIGUSR2, &sa, NULL) != 0) return -1;
  add_thread(getpid());  /* the main thread; the others register as they start */
  pthread_t refresher;  /* not a Go thread: never sampled */
  return __real_pthread_create(&refresher, NULL, refresh_maps, NULL) == 0 ? 0 : -1;
}

void strata_recorder_start(void) {
  pthread_mutex_lock(&g_mu);
  atomic_store(&g_recording, 1);
  for (int i = 0; i < g_num_threads; i++) arm_locked(i);
  pthread_mutex_unlock(&g_mu);
}

int strata_recorder_threads(void) { return g_num_threads; }
int strata_recorder_timer_failures(void) { return g_timer_failures; }
int strata_recorder_overruns(void) { return (int)atomic_load(&g_overruns); }

/* Stops the timers and writes the file; returns the number of records, or -1. */
long strata_recorder_stop(void) {
  pthread_mutex_lock(&g_mu);
  atomic_store(&g_recording, 0);
  for (int i = 0; i < g_num_threads; i++) {
    if (g_threads[i].armed) timer_delete(g_threads[i].timer);
    g_threads[i].armed = 0;
  }
  pthread_mutex_unlock(&g_mu);
  const struct timespec settle = {0, 20 * 1000 * 1000};  /* handlers still running finish */
  nanosleep(&settle, NULL);
  const int fd = open(g_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  size_t used = atomic_load(&g_used), at = 0;
  if (used > kArenaBytes) used = kArenaBytes;
  long records = 0;
  while (at + sizeof(struct record) <= used) {
    const struct record *r = (const struct record *)(g_arena + at);
    if (r->magic != kSampleMagic) break;
    at += sizeof(struct record) + ((r->stack_size + 7) & ~(uint64_t)7) + r->memory_size;
    records++;
  }
  struct record end;
  memset(&end, 0, sizeof end);
  end.magic = kEndMagic;
  end.tid = (uint32_t)records;
  end.flags = atomic_load(&g_dropped);
  for (size_t done = 0; done < at;) {
    const ssize_t n = write(fd, g_arena + done, at - done);
    if (n <= 0) return -1;
    done += (size_t)n;
  }
  if (write(fd, &end, sizeof end) != (ssize_t)sizeof end) return -1;
  return close(fd) == 0 ? records : -1;
}
