// Loaded at run time by unwind_workload_dlopen_host: its frames live in a module that was not
// mapped when the process started (and is unmapped and mapped again while sampled).
#include "common.h"

namespace {
__attribute__((noinline)) uint64_t PluginInner(int depth, uint64_t x) {
  uint64_t r = depth <= 0 ? workload::Burn(5000, x) : PluginInner(depth - 1, x + 1);
  return r ^ static_cast<uint64_t>(depth);
}
}  // namespace

extern "C" __attribute__((visibility("default"))) uint64_t strata_plugin_work(uint64_t x) {
  return PluginInner(static_cast<int>(x % 8) + 2, x) + 1;
}
