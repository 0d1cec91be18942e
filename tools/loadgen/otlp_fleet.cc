#include "tools/loadgen/otlp_fleet.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <queue>
#include <random>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/reconnector.h"
#include "opentelemetry/proto/collector/profiles/v1development/profiles_service.grpc.pb.h"

namespace strata::loadgen {
namespace {

namespace otlp_v1 = ::opentelemetry::proto::collector::profiles::v1development;

class Sender;

// Calls the gRPC threads have finished, for the driver thread.
struct Finished {
  absl::Mutex mu;
  std::vector<std::pair<Sender*, grpc::Status>> calls ABSL_GUARDED_BY(mu);
};

// One simulated agent: its requests in order, at most one in flight. Driver thread only,
// except the call's completion, which only hands its status to Finished.
class Sender {
 public:
  Sender(const FleetOptions& options, uint32_t index, const Program* program,
         std::function<double()> jitter)
      : options_(options),
        index_(index),
        program_(program),
        reconnect_({.servers = options.servers,
                    .first = index,
                    .max_backoff = options.max_backoff,
                    .jitter = std::move(jitter)}) {
    const uint32_t services = std::max<uint32_t>(1, options.services);
    service_ = absl::StrCat(options.prefix, "-svc-", index % services);
    resource_ = {{"service.name", service_},
                 {"host.name", absl::StrCat(options.prefix, "-host-", index)},
                 {"process.executable.name", "service"}};
    for (const auto& [key, values] : options.labels) {
      if (!values.empty()) resource_.emplace_back(key, values[(index / services) % values.size()]);
    }
    address_ = reconnect_.Connect();
  }

  uint32_t index() const { return index_; }
  const std::string& address() const { return address_; }
  bool idle() const { return !in_flight_ && queue_.empty(); }
  bool ready(absl::Time now) const { return !in_flight_ && !queue_.empty() && now >= retry_at_; }

  // One interval's request, queued.
  void Tick(absl::Time now) {
    const Payload& p = program_->payload(next_sequence_++ + index_);
    Pending pending{OtlpRequestOf(p, resource_, static_cast<uint64_t>(absl::ToUnixNanos(now))),
                    p.samples, p.contexts, absl::InfiniteFuture()};
    ++sent_;
    queue_.push_back(std::move(pending));
  }

  // Sends the oldest request (ready() must hold).
  void Send(otlp_v1::ProfilesService::Stub* stub, Finished* finished) {
    Pending& p = queue_.front();
    if (p.first_sent == absl::InfiniteFuture()) p.first_sent = absl::Now();
    bytes_ += p.request.ByteSizeLong();
    in_flight_ = true;
    context_ = std::make_unique<grpc::ClientContext>();
    context_->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    options_.security.Authorize(context_.get());
    stub->async()->Export(context_.get(), &p.request, &response_,
                          [this, finished](grpc::Status status) {
                            absl::MutexLock lock(&finished->mu);
                            finished->calls.emplace_back(this, std::move(status));
                          });
  }

  void OnFinished(const grpc::Status& status) {
    in_flight_ = false;
    const absl::Time now = absl::Now();
    switch (status.error_code()) {
      case grpc::StatusCode::OK: {
        reconnect_.Welcomed();
        const Pending& p = queue_.front();
        ++delivered_;
        samples_ += p.samples;
        contexts_ += p.contexts;
        latencies_ms_.push_back(static_cast<float>(absl::ToDoubleMilliseconds(now - p.first_sent)));
        queue_.pop_front();
        return;
      }
      case grpc::StatusCode::INVALID_ARGUMENT:
      case grpc::StatusCode::PERMISSION_DENIED:
      case grpc::StatusCode::UNAUTHENTICATED:
        ++rejected_;
        queue_.pop_front();
        return;
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
        ++refusals_;
        break;
      default:
        break;
    }
    ++retries_;
    retry_at_ = now + reconnect_.Closed();
    address_ = reconnect_.Connect();  // dialed once the wait is served
  }

  void AddTo(FleetReport* r) const {
    r->batches_sent += sent_;
    r->batches_delivered += delivered_;
    r->samples_delivered += samples_;
    r->contexts_delivered += contexts_;
    r->batches_unacknowledged += queue_.size();
    r->batches_rejected += rejected_;
    r->refusals += refusals_;
    r->reconnects += retries_;
    r->bytes_sent += bytes_;
    r->samples_by_service[service_] += samples_;
    r->ack_latency_ms.insert(r->ack_latency_ms.end(), latencies_ms_.begin(), latencies_ms_.end());
  }

 private:
  struct Pending {
    otlp_v1::ExportProfilesServiceRequest request;
    uint64_t samples;
    uint32_t contexts;
    absl::Time first_sent;
  };

  const FleetOptions& options_;
  const uint32_t index_;
  const Program* const program_;
  std::string service_;
  std::vector<std::pair<std::string, std::string>> resource_;
  rpc::Reconnector reconnect_;
  std::string address_;
  absl::Time retry_at_ = absl::InfinitePast();
  std::deque<Pending> queue_;  // the front is the one in flight, if any
  bool in_flight_ = false;
  std::unique_ptr<grpc::ClientContext> context_;
  otlp_v1::ExportProfilesServiceResponse response_;
  uint64_t next_sequence_ = 0, sent_ = 0, delivered_ = 0, samples_ = 0, contexts_ = 0,
           rejected_ = 0, refusals_ = 0, retries_ = 0, bytes_ = 0;
  std::vector<float> latencies_ms_;
};

// One channel per agents_per_connection agents of an address, as fleet.cc's pool.
class Stubs {
 public:
  explicit Stubs(const FleetOptions& options) : options_(options) {}

  otlp_v1::ProfilesService::Stub* For(const std::string& address, uint32_t agent) {
    const uint32_t slot = agent / options_.agents_per_connection;
    auto& stub = stubs_[{address, slot}];
    if (stub == nullptr) {
      grpc::ChannelArguments args;
      args.SetInt("strata.loadgen.channel", static_cast<int>(slot));  // distinct connections
      stub = otlp_v1::ProfilesService::NewStub(options_.security.CreateChannel(address, args));
    }
    return stub.get();
  }

 private:
  const FleetOptions& options_;
  std::map<std::pair<std::string, uint32_t>, std::unique_ptr<otlp_v1::ProfilesService::Stub>>
      stubs_;
};

}  // namespace

FleetReport RunOtlpFleet(const FleetOptions& options,
                         const std::vector<std::unique_ptr<Program>>& programs) {
  if (options.servers.empty()) return FleetReport{};
  Stubs stubs(options);
  std::minstd_rand rng(static_cast<uint32_t>(options.seed));
  auto jitter = [&rng] {
    return static_cast<double>(rng() - rng.min()) / (rng.max() - rng.min() + 1.0);
  };
  std::vector<std::unique_ptr<Sender>> senders;
  for (uint32_t i = 0; i < options.agents; ++i) {
    senders.push_back(
        std::make_unique<Sender>(options, i, programs[i % programs.size()].get(), jitter));
  }
  Finished finished;

  struct Tick {
    absl::Time at;
    uint32_t sender;
    bool operator>(const Tick& o) const { return at > o.at; }
  };
  std::priority_queue<Tick, std::vector<Tick>, std::greater<>> ticks;
  const absl::Time start = absl::Now();
  const absl::Time stop_sending = start + options.duration;
  for (uint32_t i = 0; i < options.agents; ++i) {
    ticks.push({start + options.ramp_up * (static_cast<double>(i) / options.agents) +
                    options.interval,
                i});
  }
  const absl::Time drain_deadline = stop_sending + options.drain_timeout;
  size_t in_flight = 0;
  for (;;) {
    const absl::Time now = absl::Now();
    std::vector<std::pair<Sender*, grpc::Status>> done;
    {
      absl::MutexLock lock(&finished.mu);
      done.swap(finished.calls);
    }
    for (auto& [sender, status] : done) {
      sender->OnFinished(status);
      --in_flight;
    }
    while (!ticks.empty() && ticks.top().at <= now) {
      Tick tick = ticks.top();
      ticks.pop();
      if (tick.at >= stop_sending) continue;
      senders[tick.sender]->Tick(now);
      ticks.push({tick.at + options.interval, tick.sender});
    }
    bool idle = in_flight == 0;
    for (auto& s : senders) {
      if (s->ready(now) && now < drain_deadline) {
        s->Send(stubs.For(s->address(), s->index()), &finished);
        ++in_flight;
      }
      idle &= s->idle();
    }
    if (now >= stop_sending && (idle || (now >= drain_deadline && in_flight == 0))) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  FleetReport report;
  report.sending = options.duration;
  for (const auto& s : senders) s->AddTo(&report);
  std::sort(report.ack_latency_ms.begin(), report.ack_latency_ms.end());
  return report;
}

}  // namespace strata::loadgen
