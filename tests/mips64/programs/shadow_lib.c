/* The workload's shared-library part (a separate module for the unwinder: its own rules,
 * its own load bias). Called from work(); calls back into the program. */
#include "shadow_defs.h"

NOINLINE long lib_leaf(long n) {
  ENTER(F_LIB_LEAF);
  long s = 0;
  for (long i = 0; i < n; i++) s += (i ^ (s << 1)) & 0xffff;
  LEAVE();
  return s;
}

NOINLINE long lib_entry(long n, long (*callback)(long)) {
  ENTER(F_LIB_ENTRY);
  long r = callback(n) + lib_leaf(600 + (n & 7));
  LEAVE();
  return r;
}
