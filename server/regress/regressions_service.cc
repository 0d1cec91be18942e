#include "server/regress/regressions_service.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <utility>

#include <google/protobuf/util/json_util.h>
#include "common/base/log.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/rpc/grpc_status.h"
#include "server/auth/grpc_auth.h"
#include "server/store/write_batch.h"

namespace strata::server::regress {
namespace {

// A Prometheus label value: backslash, double quote and newline escaped.
std::string PromLabel(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

// "version 1 -> 2", or "phase change at 2026-11-29T08:00:00Z (version 2)".
std::string WhatWasCompared(const v1::ReleaseVerdict& v) {
  if (v.kind() == v1::ReleaseVerdict::PHASE) {
    return absl::StrCat(
        "phase change at ",
        absl::FormatTime(absl::RFC3339_sec, absl::FromUnixMillis(v.first_seen_ms()),
                         absl::UTCTimeZone()),
        v.label().empty() ? "" : absl::StrCat(" (", v.label(), " ", v.candidate(), ")"));
  }
  return absl::StrCat(v.label(), " ", v.baseline(), " -> ", v.candidate());
}

}  // namespace

std::string VerdictJson(const v1::ReleaseVerdict& verdict) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(verdict, &json, options);
  return json;
}

absl::StatusOr<std::unique_ptr<RegressionsService>> RegressionsService::Create(
    RegressionsOptions options, ReleaseWatcherInputs inputs, store::Store* store,
    auth::Authorizer* authorizer) {
  std::optional<WebhookUrl> webhook;
  if (!options.webhook_url.empty()) {
    absl::StatusOr<WebhookUrl> url = ParseWebhookUrl(options.webhook_url);
    if (!url.ok()) return url.status();
    webhook = *url;
    if (!options.webhook_ca_file.empty() && ::access(options.webhook_ca_file.c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--regression-webhook-ca ",
                                                     options.webhook_ca_file, ": ",
                                                     std::strerror(errno)));
    }
  }
  absl::StatusOr<std::vector<store::ReleaseRecord>> stored = store->meta().ListReleases();
  if (!stored.ok()) return stored.status();
  inputs.persist = [store](const std::vector<store::ReleaseRecord>& records) {
    store::WriteBatch batch;
    for (const store::ReleaseRecord& r : records) batch.PutRelease(r);
    return store->Commit(&batch);
  };
  auto watcher = std::make_unique<ReleaseWatcher>(options.watcher, std::move(inputs), *stored);
  return std::unique_ptr<RegressionsService>(
      new RegressionsService(std::move(options), std::move(watcher), webhook, authorizer));
}

RegressionsService::RegressionsService(RegressionsOptions options,
                                       std::unique_ptr<ReleaseWatcher> watcher,
                                       std::optional<WebhookUrl> webhook,
                                       auth::Authorizer* authorizer)
    : options_(std::move(options)),
      watcher_(std::move(watcher)),
      webhook_(std::move(webhook)),
      authorizer_(authorizer) {}

RegressionsService::~RegressionsService() { Stop(); }

void RegressionsService::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] {
    bool caught_up = false;  // with the node that checked before this one
    do {
      if (options_.should_check && !options_.should_check()) {
        caught_up = false;
        continue;
      }
      if (!caught_up) caught_up = CatchUp();
      if (absl::Status s = CheckNow(); !s.ok()) {
        LogWarn("regressions: {}", s.ToString());
      }
    } while (!stop_.WaitForNotificationWithTimeout(options_.check_interval));
  });
}

void RegressionsService::Stop() {
  if (!thread_.joinable()) return;
  if (!stop_.HasBeenNotified()) stop_.Notify();
  thread_.join();
}

absl::Status RegressionsService::CheckNow() {
  absl::MutexLock lock(&check_mu_);
  ++checks_;
  absl::StatusOr<std::vector<v1::ReleaseVerdict>> changed = watcher_->Check(base::NowMs());
  CopyElsewhere();  // whatever the check stored, and what a node missed before
  if (!changed.ok()) {
    ++check_failures_;
    return changed.status();
  }
  for (const v1::ReleaseVerdict& verdict : *changed) {
    ++changes_;
    LogInfo("regressions: {} {}: {}{}", verdict.service(), WhatWasCompared(verdict),
                 v1::ReleaseVerdict::State_Name(verdict.state()),
                 verdict.functions_size() > 0
                     ? absl::StrCat(" (", verdict.functions(0).name(), ")")
                     : std::string());
    if (!webhook_.has_value()) continue;
    ++webhook_posts_;
    if (absl::Status s = PostJson(*webhook_, VerdictJson(verdict), options_.webhook_timeout,
                                    options_.webhook_ca_file);
        !s.ok()) {
      ++webhook_failures_;
      LogWarn("regressions: {}", s.ToString());
    }
  }
  return absl::OkStatus();
}

void RegressionsService::CopyElsewhere() {
  if (!options_.other_nodes || !options_.copy_to) return;
  const std::vector<std::string> nodes = options_.other_nodes();
  if (nodes.empty()) return;
  // A call carries this many records at most (a node meeting the cluster gets them all).
  constexpr size_t kRecordsPerCall = 256;
  const std::vector<v1::ReleaseVerdict> releases = watcher_->Releases();
  std::vector<std::pair<std::string, size_t>> versions;  // ReleaseId, hash of the record
  versions.reserve(releases.size());
  for (const v1::ReleaseVerdict& r : releases) {
    versions.emplace_back(ReleaseWatcher::ReleaseId(r),
                          std::hash<std::string>()(r.SerializeAsString()));
  }
  for (const std::string& node : nodes) {
    std::map<std::string, size_t>& confirmed = copied_[node];
    std::vector<size_t> due;  // indices into releases
    for (size_t i = 0; i < releases.size(); ++i) {
      auto it = confirmed.find(versions[i].first);
      if (it == confirmed.end() || it->second != versions[i].second) due.push_back(i);
    }
    for (size_t from = 0; from < due.size(); from += kRecordsPerCall) {
      const size_t to = std::min(due.size(), from + kRecordsPerCall);
      std::vector<v1::ReleaseVerdict> batch;
      for (size_t k = from; k < to; ++k) batch.push_back(releases[due[k]]);
      if (absl::Status s = options_.copy_to(node, batch); !s.ok()) {
        // Sent again after the next check.
        ++copy_failures_;
        LogWarn("regressions: copying {} release records to {}: {}", due.size() - from,
                     node, s.ToString());
        break;
      }
      copies_sent_ += batch.size();
      for (size_t k = from; k < to; ++k) {
        const auto& [id, hash] = versions[due[k]];
        confirmed[id] = hash;
      }
    }
  }
}

bool RegressionsService::CatchUp() {
  if (!options_.records_elsewhere) return true;
  std::vector<std::string> unreachable;
  absl::StatusOr<size_t> kept = Keep(options_.records_elsewhere(&unreachable));
  if (!kept.ok()) {
    LogWarn("regressions: keeping the other nodes' release records: {}",
                 kept.status().ToString());
    return false;
  }
  if (*kept > 0) LogInfo("regressions: {} release records taken from the other nodes", *kept);
  for (const std::string& node : unreachable) {
    LogWarn("regressions: reading the other nodes' release records: {}", node);
  }
  return unreachable.empty();
}

absl::StatusOr<size_t> RegressionsService::Keep(const std::vector<v1::ReleaseVerdict>& releases) {
  absl::StatusOr<size_t> kept = watcher_->Keep(releases);
  if (kept.ok()) copies_kept_ += *kept;
  return kept;
}

grpc::Status RegressionsService::ListRegressions(grpc::ServerContext* context,
                                                 const v1::ListRegressionsRequest* request,
                                                 v1::ListRegressionsResponse* response) {
  if (auto p = auth::AuthorizeCall(authorizer_, context, auth::Role::kReader, "queries",
                                   /*rate_limited=*/true);
      !p.ok()) {
    return rpc::ToGrpcStatus(p.status());
  }
  return rpc::Respond([&] { return RunList(*request, context); }, response);
}

absl::StatusOr<v1::ListRegressionsResponse> RegressionsService::RunList(
    const v1::ListRegressionsRequest& request, grpc::ServerContext* context) {
  if (request.since_ms() < 0) return absl::InvalidArgumentError("since_ms must not be negative");
  v1::ListRegressionsResponse response;
  std::vector<v1::ReleaseVerdict> verdicts =
      watcher_->Verdicts(request.service(), request.since_ms());
  if (options_.list_elsewhere) {
    std::vector<std::string> unreachable;
    std::vector<v1::ReleaseVerdict> others =
        options_.list_elsewhere(context, request, &unreachable);
    for (std::string& node : unreachable) response.add_unreachable_nodes(std::move(node));
    if (!others.empty()) {
      // One verdict per release: the node that checked last computed the newest.
      std::map<std::string, v1::ReleaseVerdict> by_release;
      for (std::vector<v1::ReleaseVerdict>* from : {&verdicts, &others}) {
        for (v1::ReleaseVerdict& v : *from) {
          auto [it, added] = by_release.try_emplace(ReleaseWatcher::ReleaseId(v), v);
          if (!added && v.updated_ms() > it->second.updated_ms()) it->second = std::move(v);
        }
      }
      verdicts.clear();
      for (auto& [id, v] : by_release) verdicts.push_back(std::move(v));
      std::stable_sort(verdicts.begin(), verdicts.end(), [](const auto& a, const auto& b) {
        return a.first_seen_ms() > b.first_seen_ms();
      });
    }
  }
  for (v1::ReleaseVerdict& v : verdicts) *response.add_verdicts() = std::move(v);
  return response;
}

std::string RegressionsService::RenderMetrics() const {
  std::string out =
      "# HELP strata_regression_detected Functions whose share rose significantly in the "
      "service's newest regressed release or phase comparison (1 while no later verdict "
      "improved on it and no rollback went back before it).\n"
      "# TYPE strata_regression_detected gauge\n";
  // Per service, the release that ran last: a regressed release first seen after it was
  // rolled back.
  std::map<std::string, v1::ReleaseVerdict> ran_last;
  for (v1::ReleaseVerdict& r : watcher_->Releases()) {
    if (r.kind() != v1::ReleaseVerdict::RELEASE) continue;
    auto [last, added] = ran_last.try_emplace(r.service(), r);
    if (!added && ReleaseWatcher::RanLater(r, last->second)) last->second = std::move(r);
  }
  // Verdicts come newest first. A regression stands while the verdicts after it find no
  // change (a release that carries it on is "unchanged" against it), until one improves, or
  // the service is rolled back to a release before it.
  std::map<std::string, bool> decided;
  for (const v1::ReleaseVerdict& v : watcher_->Verdicts("", 0)) {
    if (decided[v.service()]) continue;
    if (v.state() == v1::ReleaseVerdict::UNCHANGED ||
        v.state() == v1::ReleaseVerdict::NOT_ENOUGH_DATA) {
      continue;
    }
    decided[v.service()] = true;
    if (v.state() != v1::ReleaseVerdict::REGRESSED) continue;
    if (v.kind() == v1::ReleaseVerdict::RELEASE &&
        ran_last[v.service()].first_seen_ms() < v.first_seen_ms()) {
      continue;
    }
    for (const v1::ReleaseFunctionChange& f : v.functions()) {
      if (f.delta() <= 0) continue;
      absl::StrAppend(&out, "strata_regression_detected{service=\"", PromLabel(v.service()),
                      "\",function=\"", PromLabel(f.name()), "\",candidate=\"",
                      PromLabel(v.candidate()), "\",kind=\"",
                      v.kind() == v1::ReleaseVerdict::PHASE ? "phase" : "release", "\"} 1\n");
    }
  }
  absl::StrAppend(
      &out,
      "# HELP strata_regression_checks_total Release checks run, and those that failed.\n"
      "# TYPE strata_regression_checks_total counter\n"
      "strata_regression_checks_total ", checks_.load(), "\n",
      "strata_regression_check_failures_total ", check_failures_.load(), "\n",
      "# HELP strata_regression_verdict_changes_total Verdicts that changed state.\n"
      "# TYPE strata_regression_verdict_changes_total counter\n"
      "strata_regression_verdict_changes_total ", changes_.load(), "\n",
      "# HELP strata_regression_webhook_posts_total Verdicts POSTed to the webhook, and failures.\n"
      "# TYPE strata_regression_webhook_posts_total counter\n"
      "strata_regression_webhook_posts_total ", webhook_posts_.load(), "\n",
      "strata_regression_webhook_failures_total ", webhook_failures_.load(), "\n");
  if (options_.copy_to) {
    absl::StrAppend(
        &out,
        "# HELP strata_regression_copies_sent_total Release records the other nodes confirmed "
        "keeping, and calls that failed.\n"
        "# TYPE strata_regression_copies_sent_total counter\n"
        "strata_regression_copies_sent_total ", copies_sent_.load(), "\n",
        "strata_regression_copy_failures_total ", copy_failures_.load(), "\n",
        "# HELP strata_regression_copies_kept_total Other nodes' release records kept here "
        "(newer than this node's).\n"
        "# TYPE strata_regression_copies_kept_total counter\n"
        "strata_regression_copies_kept_total ", copies_kept_.load(), "\n");
  }
  return out;
}

}  // namespace strata::server::regress
