/* Steady-state MIPS64 stacks for mips64_lookup_benchmark: for each chain depth d in 10, 50, 200,
 * four samples taken one after another from the same call site in main() at recursion depths
 * d, d-1, d, d-2 (the outer frames stay, the leaf side changes, as a sampled thread looks
 * tick after tick; the same sequence as unwind_benchmark's BM_Seq* on x86-64).
 *
 * At the bottom of the chain spin() arms the SIGPROF handler (thread CPU-time timer, as in
 * workload.c) and busy-waits until it fired; the handler writes the interrupted pc, sp, s8,
 * ra and a copy of the stack from sp up to the initial stack top, in workload.c's record
 * format (shadow depth 0), to <prefix>.d<depth>.samples.
 *
 * Usage: chain <out-prefix>. Run under qemu-user at build time. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define MAXD 128

struct SampleHeader { /* as in workload.c */
  uint64_t magic, pc, sp, fp, ra, stack_start, stack_size;
  int32_t depth, pad;
  int32_t ids[MAXD];
  uint8_t tail[MAXD];
};

extern void *__libc_stack_end;
static int g_fd = -1;
static volatile int g_armed, g_hit, g_failed;
static volatile long sink;

static void on_prof(int sig, siginfo_t *si, void *uc_void) {
  (void)sig; (void)si;
  if (!g_armed) return;
  ucontext_t *uc = uc_void;
  struct SampleHeader h;
  memset(&h, 0, sizeof h);
  h.magic = 0x53545241544d3634ull; /* "STRATM64" */
  h.pc = uc->uc_mcontext.pc;
  h.sp = uc->uc_mcontext.gregs[29];
  h.fp = uc->uc_mcontext.gregs[30];
  h.ra = uc->uc_mcontext.gregs[31];
  uint64_t top = (uint64_t)(uintptr_t)__libc_stack_end + 64;
  if (top < h.sp || top - h.sp > (1u << 20)) top = h.sp + (256u << 10);
  h.stack_start = h.sp;
  h.stack_size = top - h.sp;
  if (write(g_fd, &h, sizeof h) != (ssize_t)sizeof h ||
      write(g_fd, (const void *)(uintptr_t)h.sp, h.stack_size) != (ssize_t)h.stack_size) {
    g_failed = 1;
  }
  g_armed = 0;
  g_hit = 1;
}

/* Frameless leaf: the sample's pc is here, ra still in its register. */
NOINLINE void spin(void) {
  g_hit = 0;
  g_armed = 1;
  while (!g_hit) {}
}

/* Not a tail call (the result is stored and added to), with a small frame of its own. */
NOINLINE long chain(int n) {
  volatile long local[2];
  local[0] = n;
  long r = n <= 1 ? (spin(), 1) : chain(n - 1);
  local[1] = r;
  sink = local[1];
  return r + local[0];
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_prof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGPROF, &sa, NULL);
  struct sigevent sev;
  memset(&sev, 0, sizeof sev);
  sev.sigev_notify = SIGEV_THREAD_ID;
  sev.sigev_signo = SIGPROF;
  sev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
  timer_t timer;
  if (timer_create(CLOCK_THREAD_CPUTIME_ID, &sev, &timer) != 0) return 1;
  struct itimerspec its = {{0, 1000000}, {0, 1000000}}; /* 1 ms of thread CPU time */
  timer_settime(timer, 0, &its, NULL);
  const int depths[3] = {10, 50, 200};
  for (int k = 0; k < 3; k++) {
    char path[4096];
    snprintf(path, sizeof path, "%s.d%d.samples", argv[1], depths[k]);
    g_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (g_fd < 0) return 1;
    const int seq[4] = {depths[k], depths[k] - 1, depths[k], depths[k] - 2};
    for (int i = 0; i < 4; i++) sink = chain(seq[i]); /* one call site for all four */
    close(g_fd);
  }
  timer_delete(timer);
  return g_failed ? 3 : 0;
}
