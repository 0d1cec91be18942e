#include "server/ingest/limits.h"

#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/labels/labels.h"
#include "server/commit/profile_type.h"

namespace strata::server::ingest {
namespace {

absl::Status TooLong(const char* what, size_t size, uint32_t bound) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " has ", size, " bytes, more than the limit of ", bound));
}

absl::Status CheckString(const char* what, const std::string& s, uint32_t bound) {
  return s.size() > bound ? TooLong(what, s.size(), bound) : absl::OkStatus();
}

absl::Status CheckKeyPart(const char* what, const std::string& s, uint32_t bound) {
  if (s.size() > bound) return TooLong(what, s.size(), bound);
  if (!ValidKeyPart(s, bound)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be non-empty, without NUL"));
  }
  return absl::OkStatus();
}

absl::Status CheckCount(const char* what, size_t n, uint64_t bound) {
  if (n <= bound) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": ", n, " is more than the limit of ", bound));
}

// Keys starting with "__" are the server's (the profile type, commit/profile_type.h).
absl::Status CheckNotReserved(const char* what, const std::string& key) {
  if (!commit::IsReservedLabelKey(key)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": label key '", key.substr(0, 64), "' is reserved: keys starting with '",
      commit::kReservedLabelPrefix, "' are set by the server"));
}

absl::Status CheckTarget(const v1::Target& t, const IngestLimits& limits) {
  if (absl::Status s = CheckKeyPart("target service", t.service(), limits.max_id_bytes); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckCount("Target.labels", t.labels_size(), limits.max_labels); !s.ok()) {
    return s;
  }
  for (const auto& [key, value] : t.labels()) {
    if (absl::Status s = labels::ValidateLabel(key, value); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("Target.labels: ", s.message()));
    }
    if (absl::Status s = CheckNotReserved("Target.labels", key); !s.ok()) return s;
  }
  return CheckString("target executable", t.executable(), limits.max_path_bytes);
}

// Contexts name their target by ID: a second target with the same ID would leave it unclear
// whose samples they are.
absl::Status CheckTargetIds(const char* what,
                            const google::protobuf::RepeatedPtrField<v1::Target>& targets) {
  absl::flat_hash_set<uint32_t> ids;
  for (const v1::Target& t : targets) {
    if (!ids.insert(t.id()).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, " list target ", t.id(), " twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool ValidKeyPart(std::string_view s, uint32_t max_bytes) {
  return !s.empty() && s.size() <= max_bytes && s.find('\0') == std::string_view::npos;
}

absl::Status CheckHello(const v1::Hello& hello, const IngestLimits& limits) {
  absl::Status s = CheckKeyPart("Hello.agent_id", hello.agent_id(), limits.max_id_bytes);
  if (s.ok()) s = CheckKeyPart("Hello.host", hello.host(), limits.max_id_bytes);
  if (s.ok()) s = CheckString("Hello.arch", hello.arch(), limits.max_id_bytes);
  if (s.ok()) s = CheckString("Hello.version", hello.version(), limits.max_id_bytes);
  if (s.ok()) s = CheckString("Hello.token", hello.token(), limits.max_text_bytes);
  if (s.ok()) s = CheckCount("Hello.labels", hello.labels_size(), limits.max_labels);
  if (!s.ok()) return s;
  for (const auto& [key, value] : hello.labels()) {
    if (key.empty() || key.size() > limits.max_id_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Hello.labels: keys must have 1 to ", limits.max_id_bytes, " bytes, got ", key.size()));
    }
    if (s = CheckString("Hello.labels value", value, limits.max_label_bytes); !s.ok()) return s;
    if (s = CheckNotReserved("Hello.labels", key); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckGraphDelta(const v1::GraphDelta& delta, const IngestLimits& limits) {
  absl::Status s = CheckCount("GraphDelta.nodes", delta.nodes_size(), limits.max_delta_nodes);
  if (s.ok()) s = CheckCount("GraphDelta.edges", delta.edges_size(), limits.max_delta_edges);
  if (!s.ok()) return s;
  for (const v1::FunctionNode& n : delta.nodes()) {
    if (s = CheckString("function name", n.name(), limits.max_name_bytes); !s.ok()) return s;
    if (s = CheckString("function module", n.module(), limits.max_path_bytes); !s.ok()) return s;
    if (s = CheckString("function build ID", n.build_id(), limits.max_id_bytes); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckBatchShape(const v1::SampleBatch& batch, const IngestLimits& limits) {
  absl::Status s =
      CheckCount("SampleBatch.targets", batch.targets_size(), limits.max_batch_targets);
  if (s.ok()) {
    s = CheckCount("SampleBatch.contexts", batch.contexts_size(), limits.max_batch_contexts);
  }
  if (s.ok() && !batch.capture_id().empty()) {
    s = CheckKeyPart("SampleBatch.capture_id", batch.capture_id(), limits.max_id_bytes);
  }
  if (!s.ok()) return s;
  if (batch.profile() != v1::PROFILE_CPU && batch.profile() != v1::PROFILE_OFF_CPU) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleBatch.profile ", static_cast<int>(batch.profile()),
                     " is not a batch type (PROFILE_CPU or PROFILE_OFF_CPU)"));
  }
  if (batch.profile() != v1::PROFILE_CPU && !batch.capture_id().empty()) {
    return absl::InvalidArgumentError(
        "captures are CPU profiles: an off-CPU batch has no capture_id");
  }
  s = CheckCount("SampleBatch.unwind", batch.unwind_size(), limits.max_batch_targets);
  if (!s.ok()) return s;
  for (const v1::UnwindCounters& u : batch.unwind()) {
    if (u.truncated() > u.stacks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("SampleBatch.unwind of target ", u.target_id(), ": ", u.truncated(),
                       " truncated stacks of ", u.stacks()));
    }
  }
  if (batch.leaf_addresses_size() > 0 &&
      (batch.profile() != v1::PROFILE_CPU || !batch.capture_id().empty())) {
    return absl::InvalidArgumentError(
        "SampleBatch.leaf_addresses come with continuous CPU batches only");
  }
  uint64_t leaf_addresses = 0;
  for (const v1::LeafAddresses& l : batch.leaf_addresses()) {
    if (l.offset_deltas_size() != l.counts_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SampleBatch.leaf_addresses of target ", l.target_id(), ", node ", l.node(), ": ",
          l.offset_deltas_size(), " offsets but ", l.counts_size(), " counts"));
    }
    leaf_addresses += static_cast<uint64_t>(l.counts_size());
  }
  s = CheckCount("SampleBatch.leaf_addresses (addresses)", leaf_addresses,
                 limits.max_batch_contexts);
  if (!s.ok()) return s;
  if (!batch.requests().empty() && !batch.capture_id().empty()) {
    return absl::InvalidArgumentError("SampleBatch.requests come with continuous batches only");
  }
  s = CheckCount("SampleBatch.requests", batch.requests_size(), limits.max_batch_services);
  if (!s.ok()) return s;
  for (const auto& [service, requests] : batch.requests()) {
    if (s = CheckKeyPart("SampleBatch.requests service", service, limits.max_id_bytes); !s.ok()) {
      return s;
    }
  }
  if (s = CheckTargetIds("SampleBatch.targets", batch.targets()); !s.ok()) return s;
  absl::flat_hash_set<std::string_view> services;
  for (const v1::Target& t : batch.targets()) {
    if (s = CheckTarget(t, limits); !s.ok()) return s;
    services.insert(t.service());
    if (services.size() > limits.max_batch_services) {
      return absl::InvalidArgumentError(
          absl::StrCat("SampleBatch.targets name more than ", limits.max_batch_services,
                       " services (strata-server --max-batch-services)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckHeartbeat(const v1::Heartbeat& heartbeat, const IngestLimits& limits) {
  absl::Status s =
      CheckCount("Heartbeat.targets", heartbeat.targets_size(), limits.max_batch_targets);
  if (s.ok()) s = CheckTargetIds("Heartbeat.targets", heartbeat.targets());
  if (!s.ok()) return s;
  for (const v1::Target& t : heartbeat.targets()) {
    if (s = CheckTarget(t, limits); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckCaptureStatus(const v1::CaptureStatus& status, const IngestLimits& limits) {
  absl::Status s = CheckString("CaptureStatus.capture_id", status.capture_id(), limits.max_id_bytes);
  if (s.ok()) s = CheckString("CaptureStatus.error", status.error(), limits.max_text_bytes);
  return s;
}

}  // namespace strata::server::ingest
