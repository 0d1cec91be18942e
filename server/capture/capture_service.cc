#include "server/capture/capture_service.h"

#include "common/base/duration.h"

#include <algorithm>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/base/log.h"
#include "common/rpc/grpc_status.h"

namespace strata::server::capture {
namespace {

constexpr uint32_t kDefaultFrequencyHz = 499;
constexpr uint32_t kMaxFrequencyHz = 10'000;
constexpr uint32_t kMaxDurationMs = 3'600'000;
// After an agent reports the end, how long its last batch may take to be stored.
constexpr absl::Duration kLastBatchWait = absl::Seconds(2);
// How long a cancelled capture waits for its agents to report the end after StopCapture.
constexpr absl::Duration kStopWait = absl::Seconds(3);

bool ValidKeyPart(const std::string& s) {
  return s.size() <= 256 && s.find('\0') == std::string::npos;
}

std::string NewCaptureId() {
  static std::mt19937_64 random(std::random_device{}());
  static absl::Mutex mu;
  uint64_t r;
  {
    absl::MutexLock lock(&mu);
    r = random();
  }
  return absl::StrCat("cap-", absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::UTCTimeZone()),
                      "-", absl::StrFormat("%04x", r & 0xffff));
}

std::string TargetText(const v1::RunCaptureRequest& r) {
  std::vector<std::string> parts;
  if (!r.service().empty()) parts.push_back(absl::StrCat("service '", r.service(), "'"));
  if (!r.host().empty()) parts.push_back(absl::StrCat("host '", r.host(), "'"));
  if (r.pid() != 0) parts.push_back(absl::StrCat("pid ", r.pid()));
  return absl::StrJoin(parts, " ");
}

v1::CaptureRecord ToRecord(const store::CaptureInfo& info) {
  v1::CaptureRecord r;
  r.set_capture_id(info.capture_id);
  r.set_service(info.service);
  r.set_host(info.host);
  r.set_pid(info.pid);
  r.set_frequency_hz(info.frequency_hz);
  r.set_start_ms(info.start_ms);
  r.set_end_ms(info.end_ms);
  r.set_finished(info.finished);
  r.set_error(info.error);
  return r;
}

absl::Status PutCapture(store::Store* store, const store::CaptureInfo& info) {
  store::WriteBatch wb;
  wb.PutCapture(info);
  return store->Commit(&wb);
}

}  // namespace

absl::StatusOr<absl::Duration> ParseRetention(const std::string& text) {
  auto ms = base::ParseRetention(text);
  if (!ms.ok()) return ms.status();
  return absl::Milliseconds(*ms);
}

CaptureService::CaptureService(store::Store* store, registry::AgentRegistry* registry,
                               Options options)
    : store_(store), registry_(registry), options_(std::move(options)) {}

CaptureService::~CaptureService() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    ++changes_;
  }
  if (sweeper_.joinable()) sweeper_.join();
}

void CaptureService::Start() {
  // A capture that was running when the previous server process stopped will never finish.
  if (auto list = store_->meta().ListCaptures(); list.ok()) {
    for (store::CaptureInfo info : *list) {
      if (info.finished) continue;
      info.finished = true;
      info.end_ms = absl::ToUnixMillis(absl::Now());
      info.error = "interrupted: the server stopped during the capture";
      if (auto st = PutCapture(store_, info); !st.ok()) {
        LogWarn("capture {}: cannot mark as interrupted: {}", info.capture_id,
                     st.ToString());
      }
    }
  }
  if (auto n = Sweep(absl::ToUnixMillis(absl::Now())); !n.ok()) {
    LogWarn("capture retention sweep: {}", n.status().ToString());
  }
  sweeper_ = std::thread([this] {
    absl::MutexLock lock(&mu_);
    while (!stopping_) {
      const bool* stopping = &stopping_;
      mu_.AwaitWithTimeout(absl::Condition(stopping), options_.sweep_interval);
      if (stopping_) break;
      mu_.Unlock();
      if (auto n = Sweep(absl::ToUnixMillis(absl::Now())); !n.ok()) {
        LogWarn("capture retention sweep: {}", n.status().ToString());
      }
      mu_.Lock();
    }
  });
}

bool CaptureService::Expired(const store::CaptureInfo& info, int64_t now_ms) const {
  if (options_.retention <= absl::ZeroDuration() || !info.finished) return false;
  const int64_t end = info.end_ms != 0 ? info.end_ms : info.start_ms;
  return end < now_ms - absl::ToInt64Milliseconds(options_.retention);
}

absl::StatusOr<int> CaptureService::Sweep(int64_t now_ms) {
  auto list = store_->meta().ListCaptures();
  if (!list.ok()) return list.status();
  int expired = 0;
  for (const auto& info : *list) {
    if (!Expired(info, now_ms)) continue;
    ++expired;
    if (options_.deleter) {
      if (auto st = options_.deleter(info.capture_id); !st.ok()) return st;
    }
  }
  if (expired > 0) {
    LogInfo("capture retention: {} capture(s) older than {} {}", expired,
                 absl::FormatDuration(options_.retention),
                 options_.deleter ? "deleted" : "hidden (no deleter configured)");
  }
  return expired;
}

void CaptureService::OnSamplesStored(const std::string& agent_id, const std::string& capture_id,
                                     uint64_t samples) {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(capture_id);
  if (it == running_.end()) return;
  auto agent = it->second->agents.find(agent_id);
  if (agent == it->second->agents.end()) return;
  agent->second.stored_samples += samples;
  ++changes_;
}

void CaptureService::OnStatus(const std::string& agent_id, const v1::CaptureStatus& status) {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(status.capture_id());
  if (it == running_.end()) return;
  auto agent = it->second->agents.find(agent_id);
  if (agent == it->second->agents.end()) return;
  AgentState& a = agent->second;
  a.reporting = true;
  a.reported_samples = status.samples();
  a.effective_frequency_hz = status.effective_frequency_hz();
  if (!status.error().empty()) a.error = status.error();
  if (status.finished() && !a.finished) {
    a.finished = true;
    a.finished_at = absl::Now();
  }
  ++changes_;
}

absl::StatusOr<std::shared_ptr<CaptureService::Running>> CaptureService::Begin(
    const v1::RunCaptureRequest& request) {
  if (request.service().empty() && request.host().empty()) {
    return absl::InvalidArgumentError("a capture needs a target: --service, or --host [--pid]");
  }
  if (request.pid() != 0 && request.host().empty() && request.service().empty()) {
    return absl::InvalidArgumentError("--pid needs --host (pids are per host)");
  }
  if (!ValidKeyPart(request.service()) || !ValidKeyPart(request.host())) {
    return absl::InvalidArgumentError("service and host must be at most 256 bytes, no NUL");
  }
  const int64_t max_duration_ms =
      std::min<int64_t>(kMaxDurationMs, absl::ToInt64Milliseconds(options_.max_duration));
  if (request.duration_ms() == 0 || request.duration_ms() > max_duration_ms) {
    ++limit_refusals_;
    return absl::InvalidArgumentError(absl::StrCat(
        "duration must be between 1 ms and ", max_duration_ms, " ms, not ", request.duration_ms(),
        " ms (the server's cap: strata-server --max-capture-duration)"));
  }
  const uint32_t max_frequency = std::min(kMaxFrequencyHz, options_.max_frequency_hz);
  const uint32_t frequency = request.frequency_hz() == 0
                                 ? std::min(kDefaultFrequencyHz, max_frequency)
                                 : request.frequency_hz();
  if (frequency > max_frequency) {
    ++limit_refusals_;
    return absl::InvalidArgumentError(absl::StrCat(
        "frequency must be at most ", max_frequency, " Hz, not ", frequency,
        " (the server's cap: strata-server --max-capture-hz)"));
  }

  std::vector<std::string> agent_ids =
      registry_->FindAgents(request.service(), request.host(), request.pid());
  // Connected agents only; their hosts and targets for the messages and metadata.
  std::map<std::string, registry::AgentStatus> infos;
  std::vector<std::string> known_targets;
  for (registry::AgentStatus& a : registry_->List()) {
    if (!a.connected) continue;
    for (const registry::TargetRef& t : a.targets) {
      known_targets.push_back(absl::StrCat(a.host, ":", t.service, "/", t.pid));
    }
    infos[a.agent_id] = std::move(a);
  }
  if (agent_ids.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no connected agent profiles ", TargetText(request),
        known_targets.empty() ? " (no agent has reported any target yet)"
                              : absl::StrCat(" (known targets, host:service/pid: ",
                                             absl::StrJoin(known_targets, ", "), ")")));
  }

  auto running = std::make_shared<Running>();
  running->info.capture_id = NewCaptureId();
  running->info.service = request.service();
  running->info.pid = request.pid();
  running->info.frequency_hz = frequency;
  running->duration_ms = request.duration_ms();
  running->started = absl::Now();
  running->info.start_ms = absl::ToUnixMillis(running->started);
  std::set<std::string> hosts;
  for (const std::string& id : agent_ids) {
    AgentState state;
    if (auto it = infos.find(id); it != infos.end()) {
      state.host = it->second.host;
      hosts.insert(state.host);
      // A pid capture names the service the pid runs as, for listings.
      if (running->info.service.empty() && request.pid() != 0) {
        for (const registry::TargetRef& t : it->second.targets) {
          if (t.pid == request.pid()) running->info.service = t.service;
        }
      }
    }
    running->agents[id] = state;
  }
  running->info.host = request.host().empty() ? absl::StrJoin(hosts, ",") : request.host();

  {
    absl::MutexLock lock(&mu_);
    for (const auto& [other_id, other] : running_) {
      for (const auto& [agent_id, state] : running->agents) {
        if (other->agents.contains(agent_id)) {
          return absl::AlreadyExistsError(absl::StrCat(
              "agent ", agent_id, " (host ", state.host, ") is already running capture ",
              other_id, " (", other->info.service.empty() ? "all targets" : other->info.service,
              "); wait for it to end or cancel it"));
        }
      }
    }
    running_[running->info.capture_id] = running;
  }
  if (auto st = PutCapture(store_, running->info); !st.ok()) {
    absl::MutexLock lock(&mu_);
    running_.erase(running->info.capture_id);
    return st;
  }

  v1::ServerMessage start;
  auto* s = start.mutable_start_capture();
  s->set_capture_id(running->info.capture_id);
  s->set_service(request.service());
  s->set_pid(request.pid());
  s->set_frequency_hz(frequency);
  s->set_duration_ms(request.duration_ms());
  size_t sent = 0;
  for (auto& [agent_id, state] : running->agents) {
    if (registry_->Send(agent_id, start)) {
      ++sent;
    } else {
      absl::MutexLock lock(&mu_);
      state.error = "agent disconnected before the capture started";
      state.finished = true;
    }
  }
  if (sent == 0) {
    Finish(running, "no agent of the target could be reached");
    return absl::FailedPreconditionError(
        absl::StrCat("no agent serving ", TargetText(request), " could be reached"));
  }
  LogInfo("capture {} of {} at {} Hz for {} ms on {} agent(s)", running->info.capture_id,
               TargetText(request), frequency, request.duration_ms(), sent);
  return running;
}

void CaptureService::StopAgents(const Running& running, const std::string& why) {
  v1::ServerMessage stop;
  stop.mutable_stop_capture()->set_capture_id(running.info.capture_id);
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, state] : running.agents) {
      if (!state.finished) ids.push_back(id);
    }
  }
  for (const auto& id : ids) registry_->Send(id, stop);
  LogInfo("capture {} stopped on {} agent(s): {}", running.info.capture_id, ids.size(), why);
}

void CaptureService::Finish(const std::shared_ptr<Running>& running, const std::string& error) {
  store::CaptureInfo info;
  {
    absl::MutexLock lock(&mu_);
    running_.erase(running->info.capture_id);
    running->info.finished = true;
    running->info.end_ms = absl::ToUnixMillis(absl::Now());
    running->info.error = error;
    info = running->info;
    ++changes_;
  }
  if (auto st = PutCapture(store_, info); !st.ok()) {
    LogError("capture {}: cannot store its end: {}", info.capture_id, st.ToString());
  }
}

v1::CaptureProgress CaptureService::ProgressOf(const Running& running) const {
  v1::CaptureProgress p;
  p.set_capture_id(running.info.capture_id);
  p.set_elapsed_ms(absl::ToInt64Milliseconds(absl::Now() - running.started));
  p.set_duration_ms(running.duration_ms);
  p.set_requested_frequency_hz(running.info.frequency_hz);
  p.set_start_ms(running.info.start_ms);
  p.set_agents(static_cast<uint32_t>(running.agents.size()));
  uint64_t samples = 0;
  uint32_t reporting = 0;
  for (const auto& [id, state] : running.agents) {
    auto* a = p.add_agent();
    a->set_agent_id(id);
    a->set_host(state.host);
    a->set_samples(state.stored_samples);
    a->set_effective_frequency_hz(state.effective_frequency_hz);
    a->set_reporting(state.reporting);
    a->set_finished(state.finished);
    a->set_error(state.error);
    samples += state.stored_samples;
    reporting += state.reporting;
  }
  p.set_samples(samples);
  p.set_agents_reporting(reporting);
  return p;
}

grpc::Status CaptureService::Run(grpc::ServerContext* context,
                                 const v1::RunCaptureRequest* request,
                                 grpc::ServerWriter<v1::CaptureProgress>* writer) {
  if (auto p = auth::AuthorizeCall(options_.authorizer, context, auth::Role::kOperator, "starting captures");
      !p.ok()) {
    return rpc::ToGrpcStatus(p.status());
  }
  auto begun = Begin(*request);
  if (absl::IsNotFound(begun.status()) && options_.run_elsewhere) {
    grpc::Status routed = options_.run_elsewhere(context, *request, writer);
    if (routed.error_code() != grpc::StatusCode::NOT_FOUND) return routed;
  }
  if (!begun.ok()) return rpc::ToGrpcStatus(begun.status());
  std::shared_ptr<Running> running = std::move(*begun);
  const absl::Time deadline =
      running->started + absl::Milliseconds(running->duration_ms) + options_.grace;
  absl::Time last_write = absl::InfinitePast();
  absl::Time last_presence_check = absl::Now();
  std::string error;       // the capture's outcome; empty: success
  bool failed_all = false;  // every agent failed: the RPC fails too
  // Cancelled: when the agents were told to stop (they ship what they sampled up to then).
  std::optional<absl::Time> stopped_at;

  for (;;) {
    v1::CaptureProgress progress;
    bool done = false;
    std::string stop_reason;  // non-empty: send StopCapture to unfinished agents
    {
      absl::MutexLock lock(&mu_);
      const uint64_t seen = changes_;
      auto changed = [this, seen]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return changes_ != seen || stopping_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&changed), options_.progress_interval);
      const absl::Time now = absl::Now();
      bool all_finished = true, all_failed = true;
      for (auto& [id, state] : running->agents) {
        // The agent reports the end after queueing its last batch; give that batch a moment
        // to be stored before the result is read.
        const bool settled = state.finished && (state.stored_samples >= state.reported_samples ||
                                                now - state.finished_at > kLastBatchWait);
        all_finished &= settled;
        all_failed &= state.finished && !state.error.empty();
      }
      if (stopping_) {
        error = "the server is shutting down";
        stop_reason = error;
        done = true;
      } else if (!running->cancel_reason.empty()) {
        // Ends once the agents' last batches are stored (or given up on), so the result
        // keeps what they sampled up to the stop.
        error = running->cancel_reason;
        if (!stopped_at.has_value()) {
          stop_reason = error;
          stopped_at = now;
        }
        done = all_finished || now - *stopped_at > kLastBatchWait + kStopWait;
      } else if (all_failed) {
        std::vector<std::string> errors;
        for (const auto& [id, state] : running->agents) {
          errors.push_back(absl::StrCat(state.host.empty() ? id : state.host, ": ", state.error));
        }
        error = absl::StrCat("no agent could run the capture (", absl::StrJoin(errors, "; "), ")");
        failed_all = true;
        done = true;
      } else if (all_finished) {
        done = true;
      } else if (now > deadline) {
        for (auto& [id, state] : running->agents) {
          if (state.finished) continue;
          state.error = "did not report the end of the capture in time";
        }
        stop_reason = "agents did not report the end in time";
        done = true;
      }
      progress = ProgressOf(*running);
    }
    if (!done && !stopped_at.has_value() && context->IsCancelled()) {
      absl::MutexLock lock(&mu_);
      running->cancel_reason = "cancelled: the client went away";
      ++changes_;
      continue;
    }
    if (!done && absl::Now() - last_presence_check > absl::Seconds(1)) {
      last_presence_check = absl::Now();
      std::set<std::string> connected;
      for (const registry::AgentStatus& a : registry_->List()) {
        if (a.connected) connected.insert(a.agent_id);
      }
      absl::MutexLock lock(&mu_);
      for (auto& [id, state] : running->agents) {
        if (state.finished || connected.contains(id)) continue;
        state.finished = true;
        state.finished_at = absl::Now();
        state.error = "agent disconnected during the capture";
        ++changes_;
      }
    }
    if (!stop_reason.empty()) StopAgents(*running, stop_reason);
    if (done) {
      Finish(running, error);
      {
        absl::MutexLock lock(&mu_);
        progress = ProgressOf(*running);
      }
      progress.set_finished(true);
      progress.set_error(error);
      writer->Write(progress);
      LogInfo("capture {} ended: {} samples{}", running->info.capture_id, progress.samples(),
                   error.empty() ? "" : absl::StrCat(", ", error));
      if (failed_all) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, error);
      return grpc::Status::OK;
    }
    if (absl::Now() - last_write >= options_.progress_interval) {
      last_write = absl::Now();
      if (!writer->Write(progress)) {
        absl::MutexLock lock(&mu_);
        running->cancel_reason = "cancelled: the client went away";
      }
    }
  }
}

grpc::Status CaptureService::Cancel(grpc::ServerContext* context, const v1::CancelCaptureRequest* request,
                                    v1::CancelCaptureResponse* response) {
  if (auto p = auth::AuthorizeCall(options_.authorizer, context, auth::Role::kOperator, "cancelling captures");
      !p.ok()) {
    return rpc::ToGrpcStatus(p.status());
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = running_.find(request->capture_id());
    if (it != running_.end()) {
      it->second->cancel_reason = "cancelled by the user";
      ++changes_;
      response->set_cancelled(true);
      return grpc::Status::OK;
    }
  }
  response->set_cancelled(options_.cancel_elsewhere &&
                          options_.cancel_elsewhere(context, *request));
  return grpc::Status::OK;
}

grpc::Status CaptureService::List(grpc::ServerContext* context, const v1::ListCapturesRequest*,
                                  v1::ListCapturesResponse* response) {
  if (auto p = auth::AuthorizeCall(options_.authorizer, context, auth::Role::kReader, "listing captures");
      !p.ok()) {
    return rpc::ToGrpcStatus(p.status());
  }
  auto list = store_->meta().ListCaptures();
  if (!list.ok()) return rpc::ToGrpcStatus(list.status());
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  for (const auto& info : *list) {
    if (!Expired(info, now_ms)) *response->add_captures() = ToRecord(info);
  }
  if (options_.list_elsewhere) {
    std::vector<std::string> unreachable;
    for (v1::CaptureRecord& r : options_.list_elsewhere(context, &unreachable)) {
      *response->add_captures() = std::move(r);
    }
    for (std::string& n : unreachable) response->add_unreachable_nodes(std::move(n));
  }
  std::sort(response->mutable_captures()->begin(), response->mutable_captures()->end(),
            [](const v1::CaptureRecord& a, const v1::CaptureRecord& b) {
              return a.start_ms() != b.start_ms() ? a.start_ms() > b.start_ms()
                                                  : a.capture_id() < b.capture_id();
            });
  return grpc::Status::OK;
}

grpc::Status CaptureService::Get(grpc::ServerContext* context, const v1::GetCaptureRequest* request,
                                 v1::CaptureRecord* response) {
  if (auto p = auth::AuthorizeCall(options_.authorizer, context, auth::Role::kReader, "reading captures");
      !p.ok()) {
    return rpc::ToGrpcStatus(p.status());
  }
  if (request->capture_id().empty() || !ValidKeyPart(request->capture_id())) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a capture ID is required");
  }
  auto info = store_->meta().GetCapture(request->capture_id());
  if (!info.ok()) {
    if (absl::IsNotFound(info.status()) && options_.get_elsewhere) {
      grpc::Status elsewhere = options_.get_elsewhere(context, *request, response);
      if (elsewhere.error_code() != grpc::StatusCode::NOT_FOUND) return elsewhere;
    }
    if (absl::IsNotFound(info.status())) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("no capture '", request->capture_id(),
                                       "' (see `strata captures`)"));
    }
    return rpc::ToGrpcStatus(info.status());
  }
  if (Expired(*info, absl::ToUnixMillis(absl::Now()))) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("capture '", request->capture_id(),
                                     "' is older than the capture retention"));
  }
  *response = ToRecord(*info);
  return grpc::Status::OK;
}

}  // namespace strata::server::capture
