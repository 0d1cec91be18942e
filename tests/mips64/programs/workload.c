/* MIPS64 test workload with a known call chain at every instant.
 *
 * Every instrumented function pushes its id on a shadow stack on entry and pops it on exit; a
 * function about to tail-call marks its entry so the callee's exit pops both (the hardware
 * frame of a tail caller is gone, so an unwinder cannot see it: such frames are counted, not
 * expected). A SIGPROF handler driven by a thread CPU-time timer (timer_create +
 * SIGEV_THREAD_ID, as the in-process sampler does) writes, per sample, the interrupted pc, sp,
 * s8 and ra, the shadow stack, and a copy of the stack from sp up to the initial stack top.
 *
 * Usage: workload <out-file> [samples]. Built for mips64el and mips64 at -O0/-O2, with and
 * without -fno-omit-frame-pointer, and run under qemu-user at build time. */
#define _GNU_SOURCE
#include <alloca.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "shadow_workload.h"

static int g_fd = -1;
static volatile int g_samples, g_limit = 300;
static timer_t g_timer;
extern void *__libc_stack_end;

struct SampleHeader {
  uint64_t magic, pc, sp, fp, ra, stack_start, stack_size;
  int32_t depth, pad;
  int32_t ids[MAXD];
  uint8_t tail[MAXD];
};

static void on_prof(int sig, siginfo_t *si, void *uc_void) {
  (void)sig; (void)si;
  ucontext_t *uc = uc_void;
  if (g_samples >= g_limit) return;
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
  h.depth = g_depth;
  for (int i = 0; i < h.depth && i < MAXD; i++) { h.ids[i] = g_shadow[i]; h.tail[i] = g_tail[i]; }
  if (write(g_fd, &h, sizeof h) != (ssize_t)sizeof h) return;
  if (write(g_fd, (const void *)(uintptr_t)h.sp, h.stack_size) != (ssize_t)h.stack_size) return;
  g_samples = g_samples + 1;
}

int main(int argc, char **argv) {
  ENTER(F_MAIN);
  if (argc < 2) return 2;
  if (argc > 2) g_limit = atoi(argv[2]);
  g_fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (g_fd < 0) return 1;
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
  if (timer_create(CLOCK_THREAD_CPUTIME_ID, &sev, &g_timer) != 0) return 1;
  struct itimerspec its = {{0, 1000000}, {0, 1000000}}; /* 1 ms of thread CPU time */
  timer_settime(g_timer, 0, &its, NULL);
  for (int iter = 0; g_samples < g_limit && iter < 200000; iter++) work(iter);
  timer_delete(g_timer);
  close(g_fd);
  LEAVE();
  return g_samples >= g_limit ? 0 : 3;
}
