// ThreadSanitizer support for Debian's Abseil (deploy/sanitize.sh tsan, LD_PRELOADed).
//
// Debian's libabsl_synchronization is built without -fsanitize=thread, so TSan does not see
// absl::Mutex, CondVar or Notification synchronize anything (their atomics and futexes are
// in uninstrumented code) and reports every access guarded by them as a race. This library
// interposes the exported entry points, calls the real ones (dlsym RTLD_NEXT) and tells TSan
// about the happens-before edges they create: release before unlocking (also before waits
// that unlock inside), acquire after locking (also after waits that lock again), and the
// same for Notification. It is what Abseil does itself when it is built with TSan, minus
// lock-order (deadlock) detection. Readers acquire and release too, which can only hide a
// race between two readers, never report one that is not there.
//
// Built against the installed Abseil headers (the inline namespace of the mangled names
// comes from ABSL_OPTION_INLINE_NAMESPACE_NAME).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define STRATA_STR2(x) #x
#define STRATA_STR(x) STRATA_STR2(x)

// "_ZN4absl<len><inline ns>" + rest (or _ZNK for const member functions).
template <typename F>
F Real(bool is_const, const char* rest) {
  const char* ns = STRATA_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  std::string name = std::string(is_const ? "_ZNK4absl" : "_ZN4absl") +
                     std::to_string(std::strlen(ns)) + ns + rest;
  void* p = dlsym(RTLD_NEXT, name.c_str());
  if (p == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found\n", name.c_str());
    std::abort();
  }
  return reinterpret_cast<F>(p);
}

#define REAL(type, is_const, rest) static const auto real = Real<type>(is_const, rest)

// Await and LockWhen evaluate the caller's Condition with the mutex held inside Abseil
// (in the waiting thread, or in the thread that unlocks), between this shim's annotations:
// each evaluation acquires the mutex before and releases it after (Abseil may unlock
// without returning to the shim, e.g. when the condition is false and the thread waits).
struct AcquiringCondition {
  absl::Mutex* mu;
  const absl::Condition* cond;
};
bool EvalAcquiring(AcquiringCondition* c) {
  __tsan_acquire(c->mu);
  const bool r = c->cond->Eval();
  __tsan_release(c->mu);
  return r;
}

void* NotifiedFlag(const absl::Notification* n) {
  // class Notification { mutable Mutex mutex_; std::atomic<bool> notified_yet_; }
  return reinterpret_cast<char*>(const_cast<absl::Notification*>(n)) + sizeof(absl::Mutex);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  REAL(void (*)(Mutex*), false, "5Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}
void Mutex::ReaderLock() {
  REAL(void (*)(Mutex*), false, "5Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}
bool Mutex::TryLock() {
  REAL(bool (*)(Mutex*), false, "5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}
bool Mutex::ReaderTryLock() {
  REAL(bool (*)(Mutex*), false, "5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}
void Mutex::Unlock() {
  REAL(void (*)(Mutex*), false, "5Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}
void Mutex::ReaderUnlock() {
  REAL(void (*)(Mutex*), false, "5Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}
void Mutex::LockWhen(const Condition& cond) {
  REAL(void (*)(Mutex*, const Condition&), false, "5Mutex8LockWhenERKNS0_9ConditionE");
  AcquiringCondition wrapped{this, &cond};
  real(this, absl::Condition(&EvalAcquiring, &wrapped));
  __tsan_acquire(this);
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  REAL(void (*)(Mutex*, const Condition&), false, "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  AcquiringCondition wrapped{this, &cond};
  real(this, absl::Condition(&EvalAcquiring, &wrapped));
  __tsan_acquire(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  REAL(bool (*)(Mutex*, const Condition&, Duration), false,
       "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AcquiringCondition wrapped{this, &cond};
  const bool r = real(this, absl::Condition(&EvalAcquiring, &wrapped), timeout);
  __tsan_acquire(this);  // held either way
  return r;
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  REAL(bool (*)(Mutex*, const Condition&, Duration), false,
       "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AcquiringCondition wrapped{this, &cond};
  const bool r = real(this, absl::Condition(&EvalAcquiring, &wrapped), timeout);
  __tsan_acquire(this);
  return r;
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  REAL(bool (*)(Mutex*, const Condition&, Time), false,
       "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AcquiringCondition wrapped{this, &cond};
  const bool r = real(this, absl::Condition(&EvalAcquiring, &wrapped), deadline);
  __tsan_acquire(this);
  return r;
}
bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  REAL(bool (*)(Mutex*, const Condition&, Time), false,
       "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AcquiringCondition wrapped{this, &cond};
  const bool r = real(this, absl::Condition(&EvalAcquiring, &wrapped), deadline);
  __tsan_acquire(this);
  return r;
}
void Mutex::Await(const Condition& cond) {
  REAL(void (*)(Mutex*, const Condition&), false, "5Mutex5AwaitERKNS0_9ConditionE");
  AcquiringCondition wrapped{this, &cond};
  __tsan_release(this);
  real(this, absl::Condition(&EvalAcquiring, &wrapped));
  __tsan_acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  REAL(bool (*)(Mutex*, const Condition&, Duration), false,
       "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AcquiringCondition wrapped{this, &cond};
  __tsan_release(this);
  const bool r = real(this, absl::Condition(&EvalAcquiring, &wrapped), timeout);
  __tsan_acquire(this);
  return r;
}
bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  REAL(bool (*)(Mutex*, const Condition&, Time), false,
       "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AcquiringCondition wrapped{this, &cond};
  __tsan_release(this);
  const bool r = real(this, absl::Condition(&EvalAcquiring, &wrapped), deadline);
  __tsan_acquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  REAL(void (*)(CondVar*, Mutex*), false, "7CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  REAL(bool (*)(CondVar*, Mutex*, Duration), false,
       "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool r = real(this, mu, timeout);
  __tsan_acquire(mu);
  return r;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  REAL(bool (*)(CondVar*, Mutex*, Time), false,
       "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool r = real(this, mu, deadline);
  __tsan_acquire(mu);
  return r;
}

void Notification::Notify() {
  REAL(void (*)(Notification*), false, "12Notification6NotifyEv");
  __tsan_release(this);
  // HasBeenNotified() is inline: its acquire load of notified_yet_ is instrumented.
  __tsan_release(NotifiedFlag(this));
  real(this);
}
void Notification::WaitForNotification() const {
  REAL(void (*)(const Notification*), true, "12Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(NotifiedFlag(this));
}
bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  REAL(bool (*)(const Notification*, Duration), true,
       "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool r = real(this, timeout);
  if (r) __tsan_acquire(NotifiedFlag(this));
  return r;
}
bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  REAL(bool (*)(const Notification*, Time), true,
       "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool r = real(this, deadline);
  if (r) __tsan_acquire(NotifiedFlag(this));
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl
