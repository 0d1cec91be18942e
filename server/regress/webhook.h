// The regression webhook: one JSON document POSTed to an operator's URL per verdict that
// changed, e.g. to an alert manager or a chat bridge: http:// or https:// (the server's
// certificate verified against the system's CAs or a given CA file, and its name against the
// URL's host), one request per connection, bounded by a timeout; a failure is the caller's to
// log.
#ifndef STRATA_SERVER_REGRESS_WEBHOOK_H_
#define STRATA_SERVER_REGRESS_WEBHOOK_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::server::regress {

struct WebhookUrl {
  bool tls = false;  // https
  std::string host;
  std::string port = "80";  // 443 for https
  std::string target = "/";  // path and query
};

// http[s]://host[:port][/path]; InvalidArgument names what is wrong.
absl::StatusOr<WebhookUrl> ParseWebhookUrl(const std::string& url);

// POSTs `json` (Content-Type: application/json). OK on a 2xx answer; Unavailable when the
// host cannot be reached, its certificate is not trusted, or it answers otherwise;
// DeadlineExceeded after `timeout`; FailedPrecondition when `ca_file` (PEM; empty: the
// system's CAs) cannot be read.
absl::Status PostJson(const WebhookUrl& url, const std::string& json, absl::Duration timeout,
                      const std::string& ca_file = "");

}  // namespace strata::server::regress

#endif  // STRATA_SERVER_REGRESS_WEBHOOK_H_
