// common/rpc/reconnector: where and when a client of strata-server's ingest stream connects
// next: the agent's shipper (agent/core/shipper.h) and each simulated agent of the load
// generator (tools/loadgen/fleet.h) run one Reconnector per stream they keep up.
//
// Servers are a list (a cluster's nodes, or one server), tried round robin from `first`. A
// node that does not own the client answers with a Redirect naming the owners: the next
// connection goes to the first of them at once, then (one per attempt) to the others, then
// back to the list. Failures back off exponentially with jitter.
//
// The machine is driven by the caller's events; it never sleeps or reads a clock, it returns
// how long to wait. States and transitions:
//
//   kIdle        --Connect()------> kConnecting   returns the address to dial
//   kConnecting  --Welcomed()-----> kConnected    the server took the stream: redirects in a
//                                                 row start again from zero
//   kConnecting  --Redirected()---> (same)        remembers the owners named; the stream ends
//   kConnected                                    with it (a Redirect is counted in a row)
//   kConnecting  --RetryAfter(d)--> (same)        the server asks for a wait of at least d
//   kConnected
//   kConnecting  --Closed()-------> kIdle         a Redirect named owners and at most
//   kConnected                                    max_redirects_in_a_row came without a
//                                                 Welcome: the owner is dialed at once, the
//                                                 backoff does not grow (returns zero)
//                                 -> kBackingOff  anything else: returns the wait
//   kBackingOff  --Connect()------> kConnecting   the wait was served: the backoff doubles
//                                                 (up to max_backoff) for the next failure
//   kBackingOff  --SkipBackoff()--> kIdle         the wait was cut short (a Flush): the
//                                                 backoff stays as it was
//
// Backoff: min_backoff at first and again after a stream that was Welcomed, unless the server
// asked to wait (RetryAfter): then it keeps growing, so that a fleet refused together does not
// come back together. A wait is uniform in [b/2, b) for b = max(backoff, retry_after), and
// never shorter than retry_after. Past max_redirects_in_a_row, a loop of nodes that disagree
// about the owner waits out the backoff before each redirect it follows.
//
// Not thread-safe: one owner drives it (the shipper's thread, the load generator's driver).
#ifndef STRATA_COMMON_RPC_RECONNECTOR_H_
#define STRATA_COMMON_RPC_RECONNECTOR_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace strata::rpc {

// Redirects followed without a backoff before a Welcome must come between.
inline constexpr int kMaxRedirectsInARow = 3;

struct ReconnectorOptions {
  std::vector<std::string> servers;  // host:port, at least one
  size_t first = 0;                  // index of the first server dialed (modulo their number)
  absl::Duration min_backoff = absl::Milliseconds(500);
  absl::Duration max_backoff = absl::Seconds(30);
  int max_redirects_in_a_row = kMaxRedirectsInARow;
  // Where in [b/2, b) a wait falls: a number in [0, 1). Null: random (seeded per Reconnector).
  std::function<double()> jitter = nullptr;
};

class Reconnector {
 public:
  enum class State { kIdle, kConnecting, kConnected, kBackingOff };

  explicit Reconnector(ReconnectorOptions options);

  // The address of the next connection: the next owner a Redirect named, else the next
  // server of the list.
  std::string Connect();
  void Welcomed();
  // The owners a Redirect named (empty addresses are ignored), replacing any earlier ones.
  void Redirected(const std::vector<std::string>& owners);
  void RetryAfter(absl::Duration least);
  // The stream ended: how long to wait before Connect() (zero when a redirect is followed at
  // once; then the state is kIdle).
  absl::Duration Closed();
  void SkipBackoff();

  State state() const { return state_; }
  absl::Duration backoff() const { return backoff_; }
  int redirects_in_a_row() const { return redirects_in_a_row_; }
  // The owners of the last Redirect not dialed yet.
  const std::deque<std::string>& owners() const { return owners_; }

 private:
  const ReconnectorOptions options_;
  std::minstd_rand rng_;
  State state_ = State::kIdle;
  size_t next_server_;
  std::deque<std::string> owners_;
  int redirects_in_a_row_ = 0;  // since the last Welcome
  bool welcomed_ = false;       // on the current stream
  bool redirected_ = false;     // on the current stream
  absl::Duration retry_after_;  // on the current stream
  absl::Duration backoff_;
};

}  // namespace strata::rpc

#endif  // STRATA_COMMON_RPC_RECONNECTOR_H_
