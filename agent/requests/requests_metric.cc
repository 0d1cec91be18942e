#include "agent/requests/requests_metric.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/log.h"

namespace strata::agent::requests {
namespace {

constexpr size_t kMaxBodyBytes = 16 << 20;

bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_' || c == ':'; }
bool IsNameChar(char c) { return IsNameStart(c) || absl::ascii_isdigit(c); }

// Reads a metric (colons allowed) or label name at the front of `s`.
absl::string_view TakeName(absl::string_view* s, bool metric) {
  size_t n = 0;
  while (n < s->size() && (n == 0 ? IsNameStart((*s)[n]) : IsNameChar((*s)[n])) &&
         (metric || (*s)[n] != ':')) {
    ++n;
  }
  absl::string_view name = s->substr(0, n);
  s->remove_prefix(n);
  return name;
}

// `{name="value",...}` at the front of `s` (the brace already taken), with \\, \" and \n
// escapes in values; a trailing comma is allowed.
absl::Status TakeLabels(absl::string_view* s,
                        std::vector<std::pair<std::string, std::string>>* labels) {
  while (true) {
    if (s->empty()) return absl::InvalidArgumentError("unterminated label set");
    if (s->front() == '}') {
      s->remove_prefix(1);
      return absl::OkStatus();
    }
    absl::string_view name = TakeName(s, false);
    if (name.empty()) return absl::InvalidArgumentError("a label name expected");
    if (s->size() < 2 || (*s)[0] != '=' || (*s)[1] != '"') {
      return absl::InvalidArgumentError(absl::StrCat("label ", name, ": =\"value\" expected"));
    }
    s->remove_prefix(2);
    std::string value;
    while (true) {
      if (s->empty()) return absl::InvalidArgumentError("unterminated label value");
      const char c = s->front();
      s->remove_prefix(1);
      if (c == '"') break;
      if (c != '\\') {
        value.push_back(c);
        continue;
      }
      if (s->empty()) return absl::InvalidArgumentError("unterminated label value");
      const char e = s->front();
      s->remove_prefix(1);
      if (e == 'n') {
        value.push_back('\n');
      } else if (e == '\\' || e == '"') {
        value.push_back(e);
      } else {
        return absl::InvalidArgumentError(absl::StrCat("bad escape \\", std::string(1, e)));
      }
    }
    labels->emplace_back(name, std::move(value));
    if (!s->empty() && s->front() == ',') s->remove_prefix(1);
    else if (s->empty() || s->front() != '}') {
      return absl::InvalidArgumentError("',' or '}' expected after a label");
    }
  }
}

// A sample value as the format writes them: a float, NaN, +Inf or -Inf.
absl::StatusOr<double> ParseValue(absl::string_view token) {
  if (token == "NaN") return std::nan("");
  if (token == "+Inf") return HUGE_VAL;
  if (token == "-Inf") return -HUGE_VAL;
  double v = 0;
  // SimpleAtod also takes "inf", "nan" and surrounding whitespace; those are not the format's.
  const bool numeric = !token.empty() && token.find_first_not_of("0123456789.eE+-") ==
                                             absl::string_view::npos;
  if (!numeric || !absl::SimpleAtod(token, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("bad value '", token, "'"));
  }
  return v;
}

struct Sample {
  absl::string_view name;
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};

absl::StatusOr<Sample> ParseSampleLine(absl::string_view line) {
  Sample sample;
  sample.name = TakeName(&line, true);
  if (sample.name.empty()) return absl::InvalidArgumentError("a metric name expected");
  if (!line.empty() && line.front() == '{') {
    line.remove_prefix(1);
    if (absl::Status s = TakeLabels(&line, &sample.labels); !s.ok()) return s;
  }
  std::vector<absl::string_view> fields =
      absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
  if (line.empty() || (line.front() != ' ' && line.front() != '\t')) {
    return absl::InvalidArgumentError("whitespace expected before the value");
  }
  if (fields.empty() || fields.size() > 2) {
    return absl::InvalidArgumentError("a value and an optional timestamp expected");
  }
  auto value = ParseValue(fields[0]);
  if (!value.ok()) return value.status();
  sample.value = *value;
  int64_t timestamp = 0;
  const bool integer = fields.size() == 2 && fields[1].find_first_not_of("-0123456789") ==
                                                absl::string_view::npos;
  if (fields.size() == 2 && (!integer || !absl::SimpleAtoi(fields[1], &timestamp))) {
    return absl::InvalidArgumentError(absl::StrCat("bad timestamp '", fields[1], "'"));
  }
  return sample;
}

bool Matches(const Sample& sample, const MetricSource& source) {
  if (sample.name != source.name) return false;
  for (const auto& [name, value] : source.matchers) {
    bool found = false;
    for (const auto& [n, v] : sample.labels) found |= n == name && v == value;
    // A label the series does not have matches an empty value, as in PromQL.
    if (!found && !value.empty()) return false;
    if (!found) {
      for (const auto& [n, v] : sample.labels) {
        if (n == name) return false;
      }
    }
  }
  return true;
}

// A socket connected to `source` before `deadline`.
absl::StatusOr<int> Connect(const MetricSource& source, absl::Time deadline) {
  sockaddr_storage address{};
  socklen_t address_size = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
  const std::string host = source.host == "localhost" ? "127.0.0.1" : source.host;
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(source.port);
    address_size = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(source.port);
    address_size = sizeof(sockaddr_in6);
  } else {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (int e = getaddrinfo(host.c_str(), nullptr, &hints, &found); e != 0 || found == nullptr) {
      return absl::UnavailableError(absl::StrCat("resolving ", host, ": ", gai_strerror(e)));
    }
    std::memcpy(&address, found->ai_addr, found->ai_addrlen);
    address_size = found->ai_addrlen;
    freeaddrinfo(found);
    if (address.ss_family == AF_INET) v4->sin_port = htons(source.port);
    else v6->sin6_port = htons(source.port);
  }
  const int fd = socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), address_size) != 0 &&
      errno != EINPROGRESS) {
    const int e = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("connecting to ", source.host, ":", source.port,
                                               ": ", std::strerror(e)));
  }
  return fd;
}

// Waits for `events` on `fd` until `deadline`.
absl::Status Wait(int fd, short events, absl::Time deadline) {
  while (true) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return absl::DeadlineExceededError("scrape timed out");
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
}

absl::StatusOr<std::string> Exchange(int fd, const MetricSource& source, absl::Time deadline) {
  if (absl::Status s = Wait(fd, POLLOUT, deadline); !s.ok()) return s;
  int error = 0;
  socklen_t size = sizeof(error);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
  if (error != 0) {
    return absl::UnavailableError(absl::StrCat("connecting to ", source.host, ":", source.port,
                                               ": ", std::strerror(error)));
  }
  const std::string request = absl::StrCat(
      "GET ", source.path, " HTTP/1.0\r\nHost: ", source.host, ":", source.port,
      "\r\nAccept: text/plain; version=0.0.4\r\nUser-Agent: strata-agent\r\n\r\n");
  for (size_t sent = 0; sent < request.size();) {
    if (absl::Status s = Wait(fd, POLLOUT, deadline); !s.ok()) return s;
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("sending: ", std::strerror(errno)));
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string response;
  char buffer[16384];
  while (true) {
    if (absl::Status s = Wait(fd, POLLIN, deadline); !s.ok()) return s;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("reading: ", std::strerror(errno)));
    }
    response.append(buffer, static_cast<size_t>(n));
    if (response.size() > kMaxBodyBytes) {
      return absl::ResourceExhaustedError("the exposition is larger than 16 MiB");
    }
  }
  return response;
}

// The body of an HTTP/1.x response; only 200 is a success.
absl::StatusOr<std::string> BodyOf(std::string response) {
  const size_t end = response.find("\r\n\r\n");
  if (end == std::string::npos || response.compare(0, 7, "HTTP/1.") != 0) {
    return absl::UnavailableError("not an HTTP response");
  }
  const absl::string_view head(response.data(), end);
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  std::vector<absl::string_view> status = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status.size() < 2 || status[1] != "200") {
    return absl::FailedPreconditionError(absl::StrCat("HTTP status: ", lines[0]));
  }
  std::optional<size_t> length;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    const std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(lines[i].substr(colon + 1));
    size_t n = 0;
    if (name == "content-length" && absl::SimpleAtoi(value, &n)) length = n;
    if (name == "transfer-encoding" || (name == "content-encoding" && value != "identity")) {
      return absl::FailedPreconditionError(absl::StrCat("unsupported ", lines[i]));
    }
  }
  std::string body = response.substr(end + 4);
  if (length) {
    if (body.size() < *length) return absl::UnavailableError("the response ended early");
    body.resize(*length);
  }
  return body;
}

}  // namespace

std::string ServiceOfCount(const MetricSource& source, const std::vector<std::string>& services) {
  if (!source.service.empty()) return source.service;
  if (services.empty()) return "";
  for (const std::string& s : services) {
    if (s != services.front()) return "";
  }
  return services.front();
}

absl::StatusOr<MetricSource> ParseMetricSource(absl::string_view flag) {
  MetricSource source;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", flag, "': ", why, " (expected [SERVICE=]http://HOST:PORT/PATH#NAME)"));
  };
  absl::string_view rest = flag;
  if (const size_t eq = rest.find('='), scheme = rest.find("http://");
      eq != absl::string_view::npos && scheme != absl::string_view::npos && eq < scheme) {
    source.service = std::string(rest.substr(0, eq));
    rest.remove_prefix(eq + 1);
    if (source.service.empty()) return bad("an empty service");
  }
  if (!absl::ConsumePrefix(&rest, "http://")) return bad("only http:// URLs");
  const size_t hash = rest.find('#');
  if (hash == absl::string_view::npos) return bad("no #NAME of the counter");
  absl::string_view url = rest.substr(0, hash);
  absl::string_view metric = rest.substr(hash + 1);
  const size_t slash = url.find('/');
  absl::string_view authority = url.substr(0, slash);
  if (slash != absl::string_view::npos) source.path = std::string(url.substr(slash));
  absl::string_view host = authority;
  if (absl::ConsumePrefix(&host, "[")) {  // [v6]:port
    const size_t close_bracket = host.find(']');
    if (close_bracket == absl::string_view::npos) return bad("unterminated [address]");
    authority = host.substr(close_bracket + 1);
    host = host.substr(0, close_bracket);
  } else {
    const size_t colon = authority.rfind(':');
    host = authority.substr(0, colon);
    authority = colon == absl::string_view::npos ? "" : authority.substr(colon);
  }
  if (host.empty()) return bad("no host");
  source.host = std::string(host);
  if (!authority.empty()) {
    uint32_t port = 0;
    if (!absl::ConsumePrefix(&authority, ":") || !absl::SimpleAtoi(authority, &port) ||
        port == 0 || port > 65535) {
      return bad("a bad port");
    }
    source.port = static_cast<uint16_t>(port);
  }
  source.name = std::string(TakeName(&metric, true));
  if (source.name.empty()) return bad("no metric name after #");
  if (!metric.empty()) {
    if (metric.front() != '{') return bad("'{' expected after the metric name");
    metric.remove_prefix(1);
    if (absl::Status s = TakeLabels(&metric, &source.matchers); !s.ok()) return bad(s.message());
    if (!metric.empty()) return bad("text after the label matchers");
  }
  return source;
}

absl::StatusOr<double> SumCounter(absl::string_view exposition, const MetricSource& source) {
  double sum = 0;
  bool found = false;
  size_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    ++line_number;
    if (line.empty() || line.front() == '#') continue;
    auto sample = !line.empty() && line.back() == '\r'
                      ? absl::InvalidArgumentError("a carriage return (lines end in \\n only)")
                      : ParseSampleLine(line);
    if (!sample.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("exposition line ", line_number, ": ", sample.status().message()));
    }
    if (!Matches(*sample, source)) continue;
    if (!(sample->value >= 0) || std::isinf(sample->value)) {
      return absl::InvalidArgumentError(absl::StrCat("exposition line ", line_number, ": ",
                                                     source.name, " is not a counter's value"));
    }
    sum += sample->value;
    found = true;
  }
  if (!found) return absl::NotFoundError(absl::StrCat("no series of ", source.name, " matches"));
  return sum;
}

absl::StatusOr<std::string> FetchExposition(const MetricSource& source, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  auto fd = Connect(source, deadline);
  if (!fd.ok()) return fd.status();
  auto response = Exchange(*fd, source, deadline);
  close(*fd);
  if (!response.ok()) return response.status();
  return BodyOf(*std::move(response));
}

std::optional<uint64_t> CounterDelta::Add(double value) {
  std::optional<uint64_t> out;
  if (last_) {
    resets_ += value < *last_;
    const double increase = value >= *last_ ? value - *last_ : value;  // below: a reset
    out = static_cast<uint64_t>(std::llround(increase));
  }
  last_ = value;
  return out;
}

RequestsScraper::RequestsScraper(MetricSource source, absl::Duration timeout)
    : source_(std::move(source)), timeout_(timeout) {}

RequestsScraper::RequestsScraper(MetricSource source, absl::Duration interval,
                                 absl::Duration timeout)
    : RequestsScraper(std::move(source), timeout) {
  thread_ = std::thread([this, interval] { Run(interval); });
}

std::unique_ptr<RequestsScraper> RequestsScraper::ForTesting(MetricSource source,
                                                             absl::Duration timeout) {
  return std::unique_ptr<RequestsScraper>(new RequestsScraper(std::move(source), timeout));
}

RequestsScraper::~RequestsScraper() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void RequestsScraper::Run(absl::Duration interval) {
  const int64_t interval_ms = std::max<int64_t>(absl::ToInt64Milliseconds(interval), 1);
  ScrapeOnce();  // the baseline
  while (true) {
    // The next multiple of the interval, where the interval loop ships its batch.
    const int64_t now_ms = absl::ToUnixMillis(absl::Now());
    const absl::Time next = absl::FromUnixMillis((now_ms / interval_ms + 1) * interval_ms);
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithDeadline(absl::Condition(&stop_), next)) return;
    }
    ScrapeOnce();
  }
}

void RequestsScraper::ScrapeOnce() {
  auto body = FetchExposition(source_, timeout_);
  const absl::StatusOr<double> value = body.ok() ? SumCounter(*body, source_) : body.status();
  absl::MutexLock lock(&mu_);
  if (!value.ok()) {
    ++stats_.failures;
    // At most once a minute: a metric endpoint down for a day must not flood the log.
    const absl::Time now = absl::Now();
    if (now - last_failure_log_ >= absl::Minutes(1)) {
      last_failure_log_ = now;
      LogWarn("requests metric {} of {}:{}{}: {} ({} failed scrapes so far)", source_.name,
                   source_.host, source_.port, source_.path, value.status().ToString(),
                   stats_.failures);
    }
    return;
  }
  ++stats_.scrapes;
  if (std::optional<uint64_t> increase = delta_.Add(*value)) pending_ += *increase;
  stats_.resets = delta_.resets();
}

uint64_t RequestsScraper::TakeRequests() {
  absl::MutexLock lock(&mu_);
  return std::exchange(pending_, 0);
}

ScraperStats RequestsScraper::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace strata::agent::requests
