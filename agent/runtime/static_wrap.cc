// pthread_create interposer for programs that link the sampler statically
// (strata_inproc_static, linked with -Wl,--wrap=pthread_create).
#include <pthread.h>

#include "agent/runtime/sampler.h"

extern "C" int __real_pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                                     void* (*start)(void*), void* arg);

extern "C" int __wrap_pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                                     void* (*start)(void*), void* arg) {
  return strata::agent::runtime::CreateRegisteredThread(__real_pthread_create, thread, attr, start, arg);
}
