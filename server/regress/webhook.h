// The regression webhook: one JSON document POSTed to an operator's URL per verdict that
// changed, e.g. to an alert manager or a chat bridge. Plain HTTP (http://host[:port]/path),
// one request per connection, bounded by a timeout; a failure is the caller's to log.
#ifndef STRATA_SERVER_REGRESS_WEBHOOK_H_
#define STRATA_SERVER_REGRESS_WEBHOOK_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::server::regress {

struct WebhookUrl {
  std::string host;
  std::string port = "80";
  std::string target = "/";  // path and query
};

// http://host[:port][/path]; InvalidArgument names what is wrong (https is not supported).
absl::StatusOr<WebhookUrl> ParseWebhookUrl(const std::string& url);

// POSTs `json` (Content-Type: application/json). OK on a 2xx answer; Unavailable when the
// host cannot be reached or answers otherwise; DeadlineExceeded after `timeout`.
absl::Status PostJson(const WebhookUrl& url, const std::string& json, absl::Duration timeout);

}  // namespace strata::server::regress

#endif  // STRATA_SERVER_REGRESS_WEBHOOK_H_
