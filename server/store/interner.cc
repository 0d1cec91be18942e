#include "server/store/interner.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/escape.h"
#include "common/base/frame_kind.h"
#include "server/store/codec.h"
#include "server/store/db.h"
#include "server/store/intern_table.h"
#include "server/store/write_batch_rep.h"

namespace strata::server::store {
namespace {

constexpr uint32_t kMaxProbes = 64;

}  // namespace

struct Interner::Impl {
  const Database* database;
  IdHash id_hash;
  std::atomic<uint64_t> collisions{0};
  InternTable stacks;
  InternTable functions;
  // Label sets read or interned so far, and per service the sets its samples use (loaded
  // from the meta index on first use; `true` once committed). Few and small: one lock.
  struct ServiceLabelSets {
    bool loaded = false;
    absl::flat_hash_map<uint64_t, bool> ids;
  };
  absl::Mutex label_mu;
  absl::flat_hash_map<uint64_t, std::string> label_sets ABSL_GUARDED_BY(label_mu);
  absl::flat_hash_map<std::string, ServiceLabelSets> service_label_sets ABSL_GUARDED_BY(label_mu);

  Impl(const Database* db, size_t cache_entries, IdHash hash)
      : database(db), id_hash(std::move(hash)), stacks(cache_entries), functions(cache_entries) {}

  rocksdb::ColumnFamilyHandle* cf(Column c) const { return database->cf(c); }

  InternTable& Table(InternKind kind) { return kind == InternKind::kStack ? stacks : functions; }
  Column ColumnOf(InternKind kind) {
    return kind == InternKind::kStack ? Column::kStacks : Column::kFunctions;
  }

  uint64_t Candidate(std::string_view identity, uint32_t probe) {
    if (id_hash) return id_hash(identity, probe);
    return ContentId(identity, probe);
  }

  // Identity of a stored record, or an error if the record is corrupt.
  static absl::StatusOr<std::string> IdentityOf(InternKind kind, std::string_view value) {
    if (kind == InternKind::kStack) {
      absl::StatusOr<StackFrames> stack = DecodeStack(value);
      if (!stack.ok()) return stack.status();
      return std::string(value);
    }
    absl::StatusOr<FunctionInfo> function = DecodeFunction(value);
    if (!function.ok()) return function.status();
    return FunctionIdentity(*function);
  }

  absl::StatusOr<uint64_t> Intern(InternKind kind, std::string_view identity, std::string value,
                                  WriteBatch* batch) {
    InternTable& table = Table(kind);
    Column column = ColumnOf(kind);
    for (uint32_t probe = 0; probe < kMaxProbes; ++probe) {
      uint64_t id = Candidate(identity, probe);
      InternTable::Shard& shard = table.ShardFor(id);
      // The shard lock covers lookup, store read and reservation of this one ID, so two
      // threads never reserve the same ID for different content.
      absl::MutexLock lock(&shard.mu);
      const InternTable::Entry* entry = nullptr;
      auto it = shard.entries.find(id);
      if (it != shard.entries.end()) {
        entry = &it->second;
      } else {
        std::string stored;
        rocksdb::Status s =
            database->db->Get(rocksdb::ReadOptions(), cf(column), IdKey(id), &stored);
        if (s.IsNotFound()) {
          entry = &table.Insert(shard, id, InternTable::Entry{std::move(value), false});
        } else if (!s.ok()) {
          return FromRocks(s);
        } else if (!IdentityOf(kind, stored).ok()) {
          // A corrupt record occupies this ID: keep probing rather than reuse it, since
          // samples may reference whatever it held.
          collisions.fetch_add(1, std::memory_order_relaxed);
          continue;
        } else {
          entry = &table.Insert(shard, id, InternTable::Entry{std::move(stored), true});
        }
      }
      absl::StatusOr<std::string> occupant = IdentityOf(kind, entry->value);
      if (!occupant.ok() || *occupant != identity) {
        collisions.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (!entry->durable) {
        // Not known to be committed (possibly pending in another batch): write it with this
        // batch too so this batch never references a missing record.
        WriteBatch::Rep& rep = BatchAccess::Of(batch);
        rep.Add(column, WriteBatch::Rep::OpType::kPut, IdKey(id), entry->value);
        rep.interned.emplace_back(kind, id);
      }
      return id;
    }
    return absl::InternalError(absl::StrCat("no free ID after ", kMaxProbes, " probes"));
  }

  absl::StatusOr<std::string> Lookup(InternKind kind, uint64_t id) {
    InternTable& table = Table(kind);
    InternTable::Shard& shard = table.ShardFor(id);
    {
      absl::MutexLock lock(&shard.mu);
      auto it = shard.entries.find(id);
      if (it != shard.entries.end()) return it->second.value;
    }
    std::string stored;
    rocksdb::Status s =
        database->db->Get(rocksdb::ReadOptions(), cf(ColumnOf(kind)), IdKey(id), &stored);
    if (!s.ok()) return FromRocks(s);
    absl::StatusOr<std::string> identity = IdentityOf(kind, stored);
    if (!identity.ok()) return identity.status();
    absl::MutexLock lock(&shard.mu);
    if (!shard.entries.contains(id)) table.Insert(shard, id, InternTable::Entry{stored, true});
    return stored;
  }

  absl::StatusOr<ServiceLabelSets*> LoadServiceLabelSets(std::string_view service)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(label_mu) {
    ServiceLabelSets& sets = service_label_sets[std::string(service)];
    if (sets.loaded) return &sets;
    const std::string prefix = ServiceLabelSetPrefix(service);
    std::unique_ptr<rocksdb::Iterator> it(
        database->db->NewIterator(rocksdb::ReadOptions(), cf(Column::kMeta)));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      if (it->key().size() != prefix.size() + 8)
        return absl::DataLossError("corrupt label set index key");
      sets.ids[GetFixed64BE(it->key().data() + prefix.size())] = true;
    }
    if (!it->status().ok()) return FromRocks(it->status());
    sets.loaded = true;
    return &sets;
  }

  // The encoded label set `id`, from memory or the store (NotFound when absent).
  absl::StatusOr<std::string> LabelSetBytes(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(label_mu) {
    if (auto it = label_sets.find(id); it != label_sets.end()) return it->second;
    std::string stored;
    rocksdb::Status s = database->db->Get(rocksdb::ReadOptions(), cf(Column::kMeta),
                                          LabelSetKey(id), &stored);
    if (!s.ok()) return FromRocks(s);
    if (!labels::Decode(stored).ok()) return absl::DataLossError("corrupt label set record");
    label_sets.emplace(id, stored);
    return stored;
  }
};

Interner::Interner(const Database* db, size_t cache_entries, IdHash id_hash)
    : impl_(std::make_unique<Impl>(db, cache_entries, std::move(id_hash))) {}

Interner::~Interner() = default;

absl::StatusOr<uint64_t> Interner::InternFunction(const FunctionInfo& function, WriteBatch* batch) {
  const FunctionInfo* interned = &function;
  FunctionInfo portable;
  const base::FrameKind kind = base::FrameKindOf(function.module);
  if (kind == base::FrameKind::kJit || kind == base::FrameKind::kJava) {
    // One lambda is one function in every process of its program, as other methods are.
    portable = function;
    portable.name = base::WithoutHiddenClassAddresses(function.name);
    interned = &portable;
  }
  return impl_->Intern(InternKind::kFunction, FunctionIdentity(*interned),
                       EncodeFunction(*interned), batch);
}

absl::StatusOr<uint64_t> Interner::InternStack(const StackFrames& stack, WriteBatch* batch) {
  std::string value = EncodeStack(stack);
  std::string identity = value;
  return impl_->Intern(InternKind::kStack, identity, std::move(value), batch);
}

absl::StatusOr<uint64_t> Interner::InternLabelSet(std::string_view service,
                                                  const labels::LabelSet& set,
                                                  uint32_t max_per_service, WriteBatch* batch) {
  if (set.empty()) return 0;
  if (service.empty() || !ValidKeyPart(service)) {
    return absl::InvalidArgumentError("service must be non-empty, without NUL");
  }
  for (size_t i = 0; i < set.size(); ++i) {
    if (absl::Status s = labels::ValidateLabel(set[i].first, set[i].second); !s.ok()) return s;
    if (set[i].second.empty() || (i > 0 && set[i - 1].first >= set[i].first)) {
      return absl::InvalidArgumentError("label set is not normalized");
    }
  }
  const std::string encoded = labels::Encode(set);
  absl::MutexLock lock(&impl_->label_mu);
  uint64_t id = 0;
  for (uint32_t probe = 0; probe < kMaxProbes && id == 0; ++probe) {
    const uint64_t candidate = impl_->Candidate(encoded, probe);
    absl::StatusOr<std::string> occupant = impl_->LabelSetBytes(candidate);
    if (absl::IsNotFound(occupant.status())) {
      impl_->label_sets.emplace(candidate, encoded);
      id = candidate;
    } else if (!occupant.ok() && !absl::IsDataLoss(occupant.status())) {
      return occupant.status();
    } else if (occupant.ok() && *occupant == encoded) {
      id = candidate;
    } else {
      impl_->collisions.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (id == 0) return absl::InternalError(absl::StrCat("no free ID after ", kMaxProbes, " probes"));
  absl::StatusOr<Impl::ServiceLabelSets*> sets = impl_->LoadServiceLabelSets(service);
  if (!sets.ok()) return sets.status();
  auto [it, inserted] = (*sets)->ids.try_emplace(id, false);
  if (inserted && (*sets)->ids.size() > max_per_service) {
    (*sets)->ids.erase(it);
    return absl::ResourceExhaustedError(
        absl::StrCat("service '", std::string(service), "' already has ", max_per_service,
                     " distinct label sets (strata-server --max-label-sets); refused {",
                     base::EscapeForLog(labels::ToString(set), 200), "}"));  // NOLINT
  }
  if (!it->second) {
    WriteBatch::Rep& rep = BatchAccess::Of(batch);
    rep.Add(Column::kMeta, WriteBatch::Rep::OpType::kPut, LabelSetKey(id), encoded);
    rep.Add(Column::kMeta, WriteBatch::Rep::OpType::kPut, ServiceLabelSetKey(service, id),
            std::string());
    rep.label_sets.emplace_back(std::string(service), id);
  }
  return id;
}

absl::StatusOr<std::vector<LabelSetRecord>> Interner::ListLabelSets(std::string_view service) {
  if (service.empty() || !ValidKeyPart(service)) {
    return absl::InvalidArgumentError("service must be non-empty, without NUL");
  }
  std::vector<LabelSetRecord> out;
  out.push_back({0, {}});
  absl::MutexLock lock(&impl_->label_mu);
  absl::StatusOr<Impl::ServiceLabelSets*> sets = impl_->LoadServiceLabelSets(service);
  if (!sets.ok()) return sets.status();
  std::vector<uint64_t> ids;
  for (const auto& [id, durable] : (*sets)->ids) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) {
    absl::StatusOr<std::string> bytes = impl_->LabelSetBytes(id);
    if (!bytes.ok()) {
      return absl::DataLossError(absl::StrCat("label set ", id, " of service '",
                                              std::string(service),
                                              "' cannot be read: ", bytes.status().message()));
    }
    absl::StatusOr<labels::LabelSet> set = labels::Decode(*bytes);
    if (!set.ok()) return absl::DataLossError(absl::StrCat("corrupt label set ", id));
    out.push_back({id, *std::move(set)});
  }
  return out;
}

absl::StatusOr<StackFrames> Interner::GetStack(uint64_t stack_id) {
  absl::StatusOr<std::string> value = impl_->Lookup(InternKind::kStack, stack_id);
  if (!value.ok()) return value.status();
  return DecodeStack(*value);
}

absl::StatusOr<FunctionInfo> Interner::GetFunction(uint64_t function_id) {
  absl::StatusOr<std::string> value = impl_->Lookup(InternKind::kFunction, function_id);
  if (!value.ok()) return value.status();
  return DecodeFunction(*value);
}

void Interner::MarkCommitted(WriteBatch* batch) {
  WriteBatch::Rep& rep = BatchAccess::Of(batch);
  for (const auto& [kind, id] : rep.interned) impl_->Table(kind).MarkDurable(id);
  if (rep.label_sets.empty()) return;
  absl::MutexLock lock(&impl_->label_mu);
  for (const auto& [service, id] : rep.label_sets) {
    auto it = impl_->service_label_sets.find(service);
    if (it == impl_->service_label_sets.end()) continue;
    if (auto s = it->second.ids.find(id); s != it->second.ids.end()) s->second = true;
  }
}

uint64_t Interner::collisions() const { return impl_->collisions.load(std::memory_order_relaxed); }
uint64_t Interner::stack_cache_entries() const { return impl_->stacks.Size(); }
uint64_t Interner::function_cache_entries() const { return impl_->functions.Size(); }

}  // namespace strata::server::store
