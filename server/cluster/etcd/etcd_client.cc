#include "server/cluster/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <climits>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "etcd/etcdserverpb/rpc.grpc.pb.h"
#include "etcd/etcdserverpb/rpc.pb.h"
#include "etcd/mvccpb/kv.pb.h"

namespace strata::server::cluster {

struct etcd_internal::Endpoint {
  std::string name;  // as given, for errors
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
};

namespace {

using etcd_internal::Endpoint;

// "host:port" for gRPC from "http://host:port", "https://host:port" or "host:port"; IPv6
// hosts in brackets. The scheme must match whether the client speaks TLS.
absl::StatusOr<std::string> ParseEndpoint(absl::string_view endpoint, bool tls) {
  absl::string_view rest = endpoint;
  if (absl::StartsWithIgnoreCase(rest, "http://")) {
    if (tls) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint \"", endpoint, "\": http://, but TLS is set up; use https://"));
    }
    rest.remove_prefix(7);
  } else if (absl::StartsWithIgnoreCase(rest, "https://")) {
    if (!tls) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint \"", endpoint, "\": https:// needs the CA of etcd's certificate"));
    }
    rest.remove_prefix(8);
  } else if (rest.find("://") != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint \"", endpoint, "\": only http:// and https:// are supported"));
  }
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  size_t colon;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    colon = close == absl::string_view::npos ? close : close + 1;
    if (colon != absl::string_view::npos && (colon >= rest.size() || rest[colon] != ':')) {
      colon = absl::string_view::npos;
    }
  } else {
    colon = rest.find(':');
    if (colon != absl::string_view::npos && rest.find(':', colon + 1) != absl::string_view::npos) {
      colon = absl::string_view::npos;
    }
  }
  if (colon == absl::string_view::npos || colon == 0 ||
      rest.find_first_of("/?#@ ") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd endpoint \"", endpoint, "\": expected http(s)://host:port or host:port"));
  }
  int port = 0;
  const absl::string_view port_text = rest.substr(colon + 1);
  if (port_text.empty() || !absl::ascii_isdigit(port_text.front()) ||
      !absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint \"", endpoint, "\": bad port \"", port_text, "\""));
  }
  return std::string(rest);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const EtcdClientOptions& options) {
  grpc::ChannelArguments args;
  const int max_backoff_ms = static_cast<int>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(options.max_reconnect_backoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_backoff_ms);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(max_backoff_ms, 1000));
  // A watch can be quiet for hours: pings find a peer that vanished without closing the
  // connection. etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A large prefix comes back in one Range response.
  args.SetMaxReceiveMessageSize(INT_MAX);
  // Connections (and their reconnect backoff) belong to this client, not shared with other
  // channels to the same address in the process.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return options.security.CreateChannel(target, args);
}

// etcd's watch and keepalive streams are otherwise served by a member that lost its leader,
// silently stale; with this the member ends them (Unavailable) instead.
void RequireLeader(grpc::ClientContext& context) { context.AddMetadata("hasleader", "true"); }

absl::Status FromGrpc(const grpc::Status& status, absl::string_view method,
                      const Endpoint& endpoint) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat("etcd ", method, " at ", endpoint.name, ": ", status.error_message()));
}

EtcdKeyValue FromProto(const mvccpb::KeyValue& kv) {
  return EtcdKeyValue{
      .key = kv.key(), .value = kv.value(), .mod_revision = kv.mod_revision(), .lease = kv.lease()};
}

// The key and range end of every key starting with `prefix`; etcd reads an empty key as
// "no key", so the empty prefix is the range from "\0".
std::pair<std::string, std::string> PrefixRange(const std::string& prefix) {
  return {prefix.empty() ? std::string(1, '\0') : prefix, EtcdPrefixRangeEnd(prefix)};
}

// How long to wait on one endpoint's reconnection before looking at the next.
constexpr absl::Duration kConnectSlice = absl::Milliseconds(100);
// The pause before asking again an endpoint that is connected but answered Unavailable (etcd
// without a leader, say).
constexpr absl::Duration kRetryPause = absl::Milliseconds(50);

// Runs `attempt` against the endpoints until one answers (any status but Unavailable) or
// `deadline` passes, or `stopping` says to give up: first each in turn from `first`, then,
// all being unavailable, whichever reconnects first. That wait is what brings a client back
// after an outage: a channel whose connection failed fails calls at once until it has
// reconnected, and gRPC's synchronous API only moves that reconnection on while some call
// waits on the channel (otherwise every 5 s, from its backup poller).
absl::Status TryEndpoints(const std::vector<std::shared_ptr<Endpoint>>& endpoints, size_t first,
                          absl::Time deadline, const std::function<bool()>& stopping,
                          const std::function<absl::Status(Endpoint&)>& attempt, size_t* answered) {
  const size_t n = endpoints.size();
  absl::Status last = absl::UnavailableError("etcd: no endpoint");
  for (size_t i = 0; i < n; ++i) {
    if ((i > 0 && absl::Now() >= deadline) || stopping()) return last;
    const size_t index = (first + i) % n;
    last = attempt(*endpoints[index]);
    if (!absl::IsUnavailable(last)) {
      *answered = index;
      return last;
    }
  }
  for (size_t i = 0; absl::Now() < deadline && !stopping(); ++i) {
    const size_t index = (first + i) % n;
    Endpoint& endpoint = *endpoints[index];
    const absl::Time slice = std::min(deadline, absl::Now() + kConnectSlice);
    if (!endpoint.channel->WaitForConnected(absl::ToChronoTime(slice))) continue;
    last = attempt(endpoint);
    if (!absl::IsUnavailable(last)) {
      *answered = index;
      return last;
    }
    absl::SleepFor(std::min(kRetryPause, deadline - absl::Now()));
  }
  return last;
}

// A unary call (or a short stream) against the endpoints, each attempt with `deadline`.
absl::Status CallEndpoints(
    const std::vector<std::shared_ptr<Endpoint>>& endpoints, std::atomic<size_t>& preferred,
    absl::string_view method, absl::Time deadline,
    const std::function<grpc::Status(Endpoint&, grpc::ClientContext&)>& call) {
  size_t answered = 0;
  absl::Status status = TryEndpoints(
      endpoints, preferred.load(std::memory_order_relaxed), deadline, [] { return false; },
      [&](Endpoint& endpoint) {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(deadline));
        return FromGrpc(call(endpoint, context), method, endpoint);
      },
      &answered);
  if (!absl::IsUnavailable(status)) preferred.store(answered, std::memory_order_relaxed);
  return status;
}

// How long past its deadline a watch's creation may take before it is cancelled.
constexpr absl::Duration kStartGrace = absl::Milliseconds(500);

// One Watch stream on a thread of its own. The thread creates the watch on the first endpoint
// that answers, reports that to Start, then delivers events until the stream ends.
class WatchImpl : public EtcdClient::Watch {
 public:
  WatchImpl(std::vector<std::shared_ptr<Endpoint>> endpoints, size_t first,
            etcdserverpb::WatchRequest request, std::function<void(const EtcdEvent&)> on_event,
            std::function<void(absl::Status)> on_end)
      : endpoints_(std::move(endpoints)),
        first_(first),
        request_(std::move(request)),
        on_event_(std::move(on_event)),
        on_end_(std::move(on_end)) {}

  ~WatchImpl() override { Stop(); }

  // Starts the thread and waits until etcd has created the watch or the thread gave up at
  // `deadline`; the index of the endpoint that created it goes to `answered`.
  absl::Status Start(absl::Time deadline, size_t* answered) {
    thread_ = std::thread([this, deadline] { Run(deadline); });
    // The thread's own answer at the deadline says more (no endpoint reachable...); this is for
    // a stream that hangs.
    if (!created_.WaitForNotificationWithDeadline(deadline + kStartGrace)) {
      Stop();
      return absl::DeadlineExceededError("etcd Watch: not created before the deadline");
    }
    if (!create_status_.ok()) {
      Stop();
      return create_status_;
    }
    *answered = answered_;
    return absl::OkStatus();
  }

 private:
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (context_ != nullptr) context_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
  }

  bool stopping() {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }

  void Run(absl::Time deadline) {
    size_t answered = 0;
    create_status_ = TryEndpoints(
        endpoints_, first_, deadline, [this] { return stopping(); },
        [this](Endpoint& endpoint) { return Open(endpoint); }, &answered);
    answered_ = answered;
    const bool created = create_status_.ok();
    created_.Notify();
    if (created) Follow(*endpoints_[answered]);
  }

  // Opens the stream and asks for the watch; OK once etcd has created it (the stream stays
  // open), else the stream is closed.
  absl::Status Open(const Endpoint& endpoint) {
    auto context = std::make_unique<grpc::ClientContext>();
    RequireLeader(*context);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::CancelledError("etcd Watch: stopped");
      context_ = context.get();
    }
    stream_ = endpoint.watch->Watch(context.get());
    absl::Status refused;
    etcdserverpb::WatchResponse response;
    if (stream_->Write(request_)) {
      while (stream_->Read(&response)) {
        // etcd answers the create request before it sends the watch's events.
        if (!response.created()) continue;
        if (!response.canceled()) {
          owned_context_ = std::move(context);
          return absl::OkStatus();
        }
        refused = absl::FailedPreconditionError(
            absl::StrCat("etcd Watch at ", endpoint.name, ": refused: ", response.cancel_reason()));
        // Ends the stream for Finish. (Only here: a cancel would replace the status a stream
        // that ended by itself has.)
        context->TryCancel();
        break;
      }
    }
    const grpc::Status finished = stream_->Finish();
    stream_.reset();
    {
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
    }
    if (!refused.ok()) return refused;
    if (finished.ok()) {
      return absl::UnavailableError(
          absl::StrCat("etcd Watch at ", endpoint.name, ": the stream ended before the watch"));
    }
    return FromGrpc(finished, "Watch", endpoint);
  }

  // Delivers the events of the created watch until its stream ends, then says why.
  void Follow(const Endpoint& endpoint) {
    absl::Status end;  // set when etcd ends the watch on a stream it keeps open
    etcdserverpb::WatchResponse response;
    while (stream_->Read(&response)) {
      if (response.compact_revision() != 0) {
        end = absl::OutOfRangeError(absl::StrCat("etcd Watch at ", endpoint.name, ": revision ",
                                                 request_.create_request().start_revision(),
                                                 " is compacted (up to ",
                                                 response.compact_revision(), ")"));
        break;
      }
      if (response.canceled()) {
        end = absl::AbortedError(absl::StrCat("etcd Watch at ", endpoint.name,
                                              ": cancelled by etcd: ", response.cancel_reason()));
        break;
      }
      for (const mvccpb::Event& event : response.events()) {
        on_event_(EtcdEvent{.type = event.type() == mvccpb::Event::DELETE ? EtcdEvent::Type::kDelete
                                                                          : EtcdEvent::Type::kPut,
                            .kv = FromProto(event.kv())});
      }
    }
    if (!end.ok()) owned_context_->TryCancel();
    const grpc::Status finished = stream_->Finish();
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
      stopping = stopping_;
    }
    if (end.ok()) {
      end = finished.ok() ? absl::UnavailableError(
                                absl::StrCat("etcd Watch at ", endpoint.name, ": the stream ended"))
                          : FromGrpc(finished, "Watch", endpoint);
    }
    if (!stopping && on_end_) on_end_(std::move(end));
  }

  const std::vector<std::shared_ptr<Endpoint>> endpoints_;
  const size_t first_;
  const etcdserverpb::WatchRequest request_;
  const std::function<void(const EtcdEvent&)> on_event_;
  const std::function<void(absl::Status)> on_end_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The stream's context while one is open, for Stop to cancel.
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;

  // Used by the thread only (the created watch's).
  std::unique_ptr<grpc::ClientContext> owned_context_;
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>>
      stream_;

  // Written by the thread before created_ is notified.
  absl::Notification created_;
  absl::Status create_status_;
  size_t answered_ = 0;

  std::thread thread_;
};

}  // namespace

std::string EtcdPrefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    const auto last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const std::string& endpoints,
                                                               EtcdClientOptions options) {
  std::vector<std::shared_ptr<Endpoint>> parsed;
  for (absl::string_view part : absl::StrSplit(endpoints, ',')) {
    part = absl::StripAsciiWhitespace(part);
    absl::StatusOr<std::string> target = ParseEndpoint(part, options.security.tls());
    if (!target.ok()) return target.status();
    auto endpoint = std::make_shared<Endpoint>();
    endpoint->name = std::string(part);
    endpoint->channel = MakeChannel(*target, options);
    endpoint->kv = etcdserverpb::KV::NewStub(endpoint->channel);
    endpoint->lease = etcdserverpb::Lease::NewStub(endpoint->channel);
    endpoint->watch = etcdserverpb::Watch::NewStub(endpoint->channel);
    parsed.push_back(std::move(endpoint));
  }
  if (options.call_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd client: call_timeout must be positive");
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(parsed), options));
}

EtcdClient::EtcdClient(std::vector<std::shared_ptr<Endpoint>> endpoints, EtcdClientOptions options)
    : endpoints_(std::move(endpoints)), options_(options) {}

EtcdClient::~EtcdClient() = default;

absl::StatusOr<int64_t> EtcdClient::GrantLease(absl::Duration ttl) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  etcdserverpb::LeaseGrantResponse response;
  absl::Status status =
      CallEndpoints(endpoints_, preferred_, "LeaseGrant", absl::Now() + options_.call_timeout,
                    [&](Endpoint& endpoint, grpc::ClientContext& context) {
                      return endpoint.lease->LeaseGrant(&context, request, &response);
                    });
  if (!status.ok()) return status;
  if (!response.error().empty()) {
    return absl::InternalError(absl::StrCat("etcd LeaseGrant: ", response.error()));
  }
  return response.id();
}

absl::Status EtcdClient::KeepAliveOnce(int64_t lease) {
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse response;
  bool answered = false;
  absl::Status status = CallEndpoints(
      endpoints_, preferred_, "LeaseKeepAlive", absl::Now() + options_.call_timeout,
      [&](Endpoint& endpoint, grpc::ClientContext& context) {
        RequireLeader(context);
        answered = false;
        auto stream = endpoint.lease->LeaseKeepAlive(&context);
        if (stream->Write(request)) {
          stream->WritesDone();
          answered = stream->Read(&response);
          // etcd ends the stream once it has read the end of the requests.
          etcdserverpb::LeaseKeepAliveResponse extra;
          while (stream->Read(&extra)) {
          }
        }
        const grpc::Status finished = stream->Finish();
        if (finished.ok() && !answered) {
          return grpc::Status(grpc::StatusCode::INTERNAL, "the stream ended without a response");
        }
        return finished;
      });
  if (!status.ok()) return status;
  // etcd answers a refresh of a lease it does not have (expired, revoked) with TTL 0.
  if (response.ttl() <= 0) {
    return absl::NotFoundError(
        absl::StrCat("etcd LeaseKeepAlive: lease ", lease, " not found (expired or revoked)"));
  }
  return absl::OkStatus();
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseRevokeResponse response;
  return CallEndpoints(endpoints_, preferred_, "LeaseRevoke", absl::Now() + options_.call_timeout,
                       [&](Endpoint& endpoint, grpc::ClientContext& context) {
                         return endpoint.lease->LeaseRevoke(&context, request, &response);
                       });
}

absl::Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  etcdserverpb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  return CallEndpoints(endpoints_, preferred_, "Put", absl::Now() + options_.call_timeout,
                       [&](Endpoint& endpoint, grpc::ClientContext& context) {
                         return endpoint.kv->Put(&context, request, &response);
                       });
}

absl::Status EtcdClient::Delete(const std::string& key) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(key);
  etcdserverpb::DeleteRangeResponse response;
  return CallEndpoints(endpoints_, preferred_, "DeleteRange", absl::Now() + options_.call_timeout,
                       [&](Endpoint& endpoint, grpc::ClientContext& context) {
                         return endpoint.kv->DeleteRange(&context, request, &response);
                       });
}

absl::StatusOr<std::string> EtcdClient::PutIfAbsent(const std::string& key,
                                                    const std::string& value) {
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare& absent = *request.add_compare();
  absent.set_key(key);
  absent.set_target(etcdserverpb::Compare::CREATE);
  absent.set_result(etcdserverpb::Compare::EQUAL);
  absent.set_create_revision(0);
  etcdserverpb::PutRequest& put = *request.add_success()->mutable_request_put();
  put.set_key(key);
  put.set_value(value);
  request.add_failure()->mutable_request_range()->set_key(key);
  etcdserverpb::TxnResponse response;
  absl::Status status =
      CallEndpoints(endpoints_, preferred_, "Txn", absl::Now() + options_.call_timeout,
                    [&](Endpoint& endpoint, grpc::ClientContext& context) {
                      return endpoint.kv->Txn(&context, request, &response);
                    });
  if (!status.ok()) return status;
  if (response.succeeded()) return value;
  // A retried call whose first attempt put the key finds it here: its value is `value`.
  if (response.responses_size() != 1 || !response.responses(0).has_response_range() ||
      response.responses(0).response_range().kvs_size() != 1) {
    // Deleted between the compare and the read cannot happen within one transaction.
    return absl::InternalError("etcd Txn: no value for a key that exists");
  }
  return response.responses(0).response_range().kvs(0).value();
}

absl::StatusOr<EtcdClient::RangeResult> EtcdClient::GetPrefix(const std::string& prefix) {
  etcdserverpb::RangeRequest request;
  auto [key, range_end] = PrefixRange(prefix);
  request.set_key(std::move(key));
  request.set_range_end(std::move(range_end));
  etcdserverpb::RangeResponse response;
  absl::Status status =
      CallEndpoints(endpoints_, preferred_, "Range", absl::Now() + options_.call_timeout,
                    [&](Endpoint& endpoint, grpc::ClientContext& context) {
                      return endpoint.kv->Range(&context, request, &response);
                    });
  if (!status.ok()) return status;
  RangeResult result;
  result.revision = response.header().revision();
  result.kvs.reserve(response.kvs_size());
  for (const mvccpb::KeyValue& kv : response.kvs()) result.kvs.push_back(FromProto(kv));
  return result;
}

absl::StatusOr<std::unique_ptr<EtcdClient::Watch>> EtcdClient::WatchPrefix(
    const std::string& prefix, int64_t start_revision,
    std::function<void(const EtcdEvent&)> on_event, std::function<void(absl::Status)> on_end) {
  if (!on_event) return absl::InvalidArgumentError("etcd Watch: no event callback");
  etcdserverpb::WatchRequest request;
  etcdserverpb::WatchCreateRequest& create = *request.mutable_create_request();
  auto [key, range_end] = PrefixRange(prefix);
  create.set_key(std::move(key));
  create.set_range_end(std::move(range_end));
  create.set_start_revision(std::max<int64_t>(0, start_revision));

  const size_t first = preferred_.load(std::memory_order_relaxed);
  auto watch = std::make_unique<WatchImpl>(endpoints_, first, std::move(request),
                                           std::move(on_event), std::move(on_end));
  size_t answered = 0;
  absl::Status status = watch->Start(absl::Now() + options_.call_timeout, &answered);
  if (!status.ok()) return status;
  preferred_.store(answered, std::memory_order_relaxed);
  return watch;
}

}  // namespace strata::server::cluster
