// Calls into a library it dlopen()s at run time: 200 ms with the library loaded, 100 ms
// without it (working in its own code), repeatedly, so the mappings change while sampled.
//   unwind_workload_dlopen_host [SECONDS] PLUGIN_PATH
#include <dlfcn.h>

#include <cstdio>

#include "common.h"

namespace {

using Work = uint64_t (*)(uint64_t);

__attribute__((noinline)) uint64_t HostWork(uint64_t x) { return workload::Burn(5000, x); }

__attribute__((noinline)) uint64_t CallPlugin(Work work, uint64_t x, int depth) {
  uint64_t r = depth <= 0 ? work(x) : CallPlugin(work, x * 5 + 1, depth - 1);
  return r + static_cast<uint64_t>(depth);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s SECONDS PLUGIN_PATH\n", argv[0]);
    return 2;
  }
  workload::Deadline deadline(workload::Seconds(argc, argv));
  uint64_t acc = 0;
  while (!deadline.passed()) {
    void* handle = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      std::fprintf(stderr, "dlopen: %s\n", dlerror());
      return 1;
    }
    auto work = reinterpret_cast<Work>(dlsym(handle, "strata_plugin_work"));
    if (work == nullptr) return 1;
    workload::Deadline round(0.2);
    while (!round.passed() && !deadline.passed()) acc += CallPlugin(work, acc, 12);
    dlclose(handle);
    workload::Deadline without(0.1);
    while (!without.passed() && !deadline.passed()) acc += CallPlugin(HostWork, acc, 12);
  }
  return static_cast<int>(acc & 1);
}
