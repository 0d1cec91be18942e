// pthread_create interposer for the LD_PRELOAD build (libstrata_inproc.so): threads the
// program creates are registered with the sampler before they run.
#include <dlfcn.h>
#include <pthread.h>

#include "agent/runtime/sampler.h"

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                              void* (*start)(void*), void* arg) {
  static const auto real =
      reinterpret_cast<strata::agent::runtime::PthreadCreateFn>(dlsym(RTLD_NEXT, "pthread_create"));
  return strata::agent::runtime::CreateRegisteredThread(real, thread, attr, start, arg);
}
