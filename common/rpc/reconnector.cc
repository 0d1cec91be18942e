#include "common/rpc/reconnector.h"

#include <algorithm>
#include <utility>

namespace strata::rpc {

Reconnector::Reconnector(ReconnectorOptions options)
    : options_(std::move(options)),
      rng_(std::random_device{}()),
      next_server_(options_.servers.empty() ? 0 : options_.first % options_.servers.size()),
      backoff_(options_.min_backoff) {}

std::string Reconnector::Connect() {
  if (state_ == State::kBackingOff) backoff_ = std::min(backoff_ * 2, options_.max_backoff);
  state_ = State::kConnecting;
  welcomed_ = false;
  redirected_ = false;
  retry_after_ = absl::ZeroDuration();
  if (!owners_.empty()) {
    std::string address = std::move(owners_.front());
    owners_.pop_front();
    return address;
  }
  if (options_.servers.empty()) return std::string();
  const std::string& address = options_.servers[next_server_];
  next_server_ = (next_server_ + 1) % options_.servers.size();
  return address;
}

void Reconnector::Welcomed() {
  state_ = State::kConnected;
  welcomed_ = true;
  redirects_in_a_row_ = 0;
}

void Reconnector::Redirected(const std::vector<std::string>& owners) {
  redirected_ = true;
  ++redirects_in_a_row_;
  owners_.clear();
  for (const std::string& owner : owners) {
    if (!owner.empty()) owners_.push_back(owner);
  }
}

void Reconnector::RetryAfter(absl::Duration least) { retry_after_ = std::max(retry_after_, least); }

absl::Duration Reconnector::Closed() {
  if (welcomed_ && retry_after_ == absl::ZeroDuration()) backoff_ = options_.min_backoff;
  // Not a failure: the owner is dialed at once, unless redirects keep coming without a
  // Welcome (nodes that disagree).
  if (redirected_ && !owners_.empty() && redirects_in_a_row_ <= options_.max_redirects_in_a_row) {
    state_ = State::kIdle;
    return absl::ZeroDuration();
  }
  state_ = State::kBackingOff;
  const double u = options_.jitter ? options_.jitter()
                                   : static_cast<double>(rng_() - rng_.min()) /
                                         (rng_.max() - rng_.min() + 1.0);
  const absl::Duration longest = std::max(backoff_, retry_after_);
  return std::max(longest / 2 + longest / 2 * u, retry_after_);
}

void Reconnector::SkipBackoff() {
  if (state_ == State::kBackingOff) state_ = State::kIdle;
}

}  // namespace strata::rpc
