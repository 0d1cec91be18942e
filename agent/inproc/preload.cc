// pthread_create interposer for the LD_PRELOAD build (libstrata_inproc.so): threads the
// program creates are registered with the sampler before they run.
#include <dlfcn.h>
#include <pthread.h>

#include "agent/inproc/sampler.h"

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                              void* (*start)(void*), void* arg) {
  static const auto real =
      reinterpret_cast<strata::inproc::PthreadCreateFn>(dlsym(RTLD_NEXT, "pthread_create"));
  return strata::inproc::CreateRegisteredThread(real, thread, attr, start, arg);
}
