// The throughput of a service from a Prometheus counter (strata-agent --requests-metric): the
// agent fetches the text exposition format over plain HTTP once per shipping interval, sums
// the counter's matching series and ships the increase since the previous scrape with the
// interval's batch (SampleBatch.requests), so that the server can report CPU per request.
//
// Parsing is strict: a malformed exposition is an error naming its line, never a guess. The
// fetch is a bounded HTTP/1.0 GET over a POSIX socket (no TLS, no redirects): small enough for
// the static MIPS64 agent. RequestsScraper owns a thread of its own, off the sampling path;
// the interval loop takes what it counted with TakeRequests.
#ifndef STRATA_AGENT_REQUESTS_REQUESTS_METRIC_H_
#define STRATA_AGENT_REQUESTS_REQUESTS_METRIC_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace strata::agent::requests {

// "[SERVICE=]http://HOST:PORT/PATH#NAME{label="value",...}".
struct MetricSource {
  std::string service;  // empty: the one service of the batch's targets
  std::string host;
  uint16_t port = 80;
  std::string path = "/";
  std::string name;  // the counter's metric name
  std::vector<std::pair<std::string, std::string>> matchers;  // label = value, all must hold
};

// InvalidArgument naming what is wrong.
absl::StatusOr<MetricSource> ParseMetricSource(absl::string_view flag);

// The service a count of `source` goes to in a batch whose targets run `services` (repeats
// allowed): the source's own, else the batch's one service; empty when the batch has none or
// several, and the count cannot be told apart.
std::string ServiceOfCount(const MetricSource& source, const std::vector<std::string>& services);

// The sum of the series of `source.name` whose labels match, in a Prometheus text exposition.
// InvalidArgument (with the line) for a malformed exposition; NotFound when no series matches;
// a negative, NaN or infinite counter value is malformed.
absl::StatusOr<double> SumCounter(absl::string_view exposition, const MetricSource& source);

// The body of GET http://source.host:source.port/source.path within `timeout` (connect, send
// and read together). Unavailable for a network failure, DeadlineExceeded past the timeout,
// FailedPrecondition for a status other than 200; bodies beyond 16 MiB are refused.
absl::StatusOr<std::string> FetchExposition(const MetricSource& source, absl::Duration timeout);

// Increases of a counter between scrapes: a value below the previous one is a reset (the
// process restarted), and the new value is the increase.
class CounterDelta {
 public:
  // The increase since the previous value; nullopt for the first.
  std::optional<uint64_t> Add(double value);
  uint64_t resets() const { return resets_; }

 private:
  std::optional<double> last_;
  uint64_t resets_ = 0;
};

struct ScraperStats {
  uint64_t scrapes = 0;   // successful
  uint64_t failures = 0;  // fetches or parses that failed (nothing counted for them)
  uint64_t resets = 0;    // counter resets seen
};

class RequestsScraper {
 public:
  // Scrapes once at once (the baseline value), then every `interval` on the wall clock's
  // multiples of it until destroyed; each fetch within `timeout`.
  RequestsScraper(MetricSource source, absl::Duration interval, absl::Duration timeout);
  ~RequestsScraper();
  RequestsScraper(const RequestsScraper&) = delete;
  RequestsScraper& operator=(const RequestsScraper&) = delete;

  // One scrape now: the thread's work, which tests call on a scraper without a thread.
  void ScrapeOnce();
  // The requests counted since the previous call (0: none, or not known yet).
  uint64_t TakeRequests();
  const MetricSource& source() const { return source_; }
  ScraperStats stats() const;

  // A scraper without its thread.
  static std::unique_ptr<RequestsScraper> ForTesting(MetricSource source, absl::Duration timeout);

 private:
  RequestsScraper(MetricSource source, absl::Duration timeout);
  void Run(absl::Duration interval);

  const MetricSource source_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  CounterDelta delta_ ABSL_GUARDED_BY(mu_);
  uint64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  ScraperStats stats_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_failure_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread thread_;
};

}  // namespace strata::agent::requests

#endif  // STRATA_AGENT_REQUESTS_REQUESTS_METRIC_H_
