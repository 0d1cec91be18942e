// Loaded at run time by unwind_workload_dlopen_host: its frames live in a module that was not
// mapped when the process started, and that is unmapped and mapped again while sampled. It
// must stay unloadable, so it has no C++ inline variables (those become STB_GNU_UNIQUE
// symbols, which make dlclose a no-op): it does not include common.h.
#include <cstdint>

namespace {

volatile uint64_t g_plugin_sink = 0;

__attribute__((noinline)) uint64_t PluginBurn(uint64_t n, uint64_t x) {
  x |= 1;
  for (uint64_t i = 0; i < n; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
  g_plugin_sink = g_plugin_sink + x;
  return x;
}

__attribute__((noinline)) uint64_t PluginInner(int depth, uint64_t x) {
  uint64_t r = depth <= 0 ? PluginBurn(5000, x) : PluginInner(depth - 1, x + 1);
  return r ^ static_cast<uint64_t>(depth);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) uint64_t strata_plugin_work(uint64_t x) {
  return PluginInner(static_cast<int>(x % 8) + 2, x) + 1;
}
