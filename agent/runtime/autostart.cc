// Starts the in-process sampler when the library is loaded (LD_PRELOAD, or linked into a
// program) unless STRATA_INPROC=0, and removes its ring at exit.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "agent/runtime/sampler.h"

namespace {

__attribute__((constructor)) void StrataInprocAutostart() {
  const char* enabled = getenv("STRATA_INPROC");
  if (enabled != nullptr && std::strcmp(enabled, "0") == 0) return;
  absl::Status st = strata::agent::runtime::Start(strata::agent::runtime::OptionsFromEnvironment());
  if (!st.ok()) {
    const std::string msg = "libstrata_inproc: not sampling: " + st.ToString() + "\n";
    (void)!write(STDERR_FILENO, msg.data(), msg.size());
  }
}

__attribute__((destructor)) void StrataInprocShutdown() { strata::agent::runtime::Stop(); }

}  // namespace
