// Waiting on a condition in tests: poll it until it holds or a deadline passes, instead of
// sleeping for a guessed time.
#ifndef STRATA_COMMON_TESTING_WAIT_FOR_H_
#define STRATA_COMMON_TESTING_WAIT_FOR_H_

#include <chrono>
#include <thread>

namespace strata::testing {

// Polls `done()` every `period` until it holds or `timeout` passes; false on timeout. A
// condition that costs a query to check (an RPC, a scrape) takes a longer period.
template <typename Pred>
bool WaitFor(Pred done, std::chrono::milliseconds timeout, std::chrono::milliseconds period) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(period);
  }
  return true;
}

template <typename Pred>
bool WaitFor(Pred done, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  return WaitFor(done, timeout, std::chrono::milliseconds(2));
}

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_WAIT_FOR_H_
