#include "server/store/codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata::server::store {
namespace {

absl::Status Corrupt(const char* what) {
  return absl::DataLossError(absl::StrCat("corrupt ", what, " record"));
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutString(std::string* out, std::string_view s) {
  PutVarint(out, s.size());
  out->append(s);
}

// Bounds-checked sequential reader over a value; every Read fails instead of overrunning.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  bool Varint(uint64_t* v) {
    uint64_t result = 0;
    for (int shift = 0; shift <= 63 && !in_.empty(); shift += 7) {
      uint8_t byte = static_cast<uint8_t>(in_[0]);
      in_.remove_prefix(1);
      result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        *v = result;
        return true;
      }
    }
    return false;
  }
  bool Varint32(uint32_t* v) {
    uint64_t wide;
    if (!Varint(&wide) || wide > UINT32_MAX) return false;
    *v = static_cast<uint32_t>(wide);
    return true;
  }
  bool String(std::string* s) {
    uint64_t len;
    if (!Varint(&len) || len > in_.size()) return false;
    s->assign(in_.data(), len);
    in_.remove_prefix(len);
    return true;
  }
  bool Fixed64(uint64_t* v) {
    if (in_.size() < 8) return false;
    *v = GetFixed64LE(in_.data());
    in_.remove_prefix(8);
    return true;
  }
  bool Byte(uint8_t* b) {
    if (in_.empty()) return false;
    *b = static_cast<uint8_t>(in_[0]);
    in_.remove_prefix(1);
    return true;
  }
  bool Done() const { return in_.empty(); }

 private:
  std::string_view in_;
};

std::string TaggedKey(char tag, std::string_view name) {
  std::string key;
  key.reserve(1 + name.size());
  key.push_back(tag);
  key.append(name);
  return key;
}

// tag name '\0' BE(id): a record per (agent, incarnation).
std::string TaggedIdKey(char tag, std::string_view name, uint64_t id) {
  std::string key = TaggedKey(tag, name);
  key.push_back('\0');
  PutFixed64BE(&key, id);
  return key;
}

}  // namespace

uint64_t Hash64(std::string_view data, uint64_t seed) {
  constexpr uint64_t m = 0xc6a4a7935bd1e995ULL;
  constexpr int r = 47;
  uint64_t h = seed ^ (data.size() * m);
  const char* p = data.data();
  size_t n = data.size();
  while (n >= 8) {
    uint64_t k = GetFixed64LE(p);
    k *= m;
    k ^= k >> r;
    k *= m;
    h ^= k;
    h *= m;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t k = 0;
    for (size_t i = 0; i < n; ++i) k |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
    h ^= k;
    h *= m;
  }
  h ^= h >> r;
  h *= m;
  h ^= h >> r;
  return h;
}

uint64_t ContentId(std::string_view identity, uint32_t probe) {
  uint64_t id = Hash64(identity, 0x5354524154410000ULL + probe);  // "STRATA" + probe
  return id == 0 ? 1 : id;
}

void PutFixed64BE(std::string* out, uint64_t v) {
  char buf[8];
  for (int i = 7; i >= 0; --i) {
    buf[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  out->append(buf, 8);
}

uint64_t GetFixed64BE(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

void PutFixed64LE(std::string* out, uint64_t v) {
  char buf[8];
  for (int i = 0; i < 8; ++i) {
    buf[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  out->append(buf, 8);
}

uint64_t GetFixed64LE(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string IdKey(uint64_t id) {
  std::string key;
  PutFixed64BE(&key, id);
  return key;
}

absl::StatusOr<uint64_t> DecodeIdKey(std::string_view key) {
  if (key.size() != 8) return Corrupt("id key");
  return GetFixed64BE(key.data());
}

std::string CellPrefix(std::string_view scope, uint64_t window_start_ms) {
  std::string key;
  key.reserve(scope.size() + 9);
  key.append(scope);
  key.push_back('\0');
  PutFixed64BE(&key, window_start_ms);
  return key;
}

std::string EncodeCellKey(std::string_view scope, uint64_t window_start_ms,
                          std::string_view host, uint64_t stack_id, uint64_t label_set) {
  std::string key = CellPrefix(scope, window_start_ms);
  key.append(host);
  key.push_back('\0');
  PutFixed64BE(&key, stack_id);
  if (label_set != 0) PutFixed64BE(&key, label_set);
  return key;
}

absl::StatusOr<CellKey> DecodeCellKey(std::string_view key) {
  CellKey cell;
  size_t scope_end = key.find('\0');
  if (scope_end == std::string_view::npos || key.size() < scope_end + 1 + 8 + 1 + 8) {
    return Corrupt("sample key");
  }
  cell.scope = key.substr(0, scope_end);
  cell.window_start_ms = GetFixed64BE(key.data() + scope_end + 1);
  std::string_view rest = key.substr(scope_end + 9);
  // The host has no NUL: it ends at the first one, and 8 stack ID bytes follow, then 8
  // label set ID bytes in keys of labelled samples (none in keys written before labels).
  const size_t host_end = rest.find('\0');
  if (host_end == std::string_view::npos) return Corrupt("sample key");
  const size_t tail = rest.size() - host_end - 1;
  if (tail != 8 && tail != 16) return Corrupt("sample key");
  cell.host = rest.substr(0, host_end);
  cell.stack_id = GetFixed64BE(rest.data() + host_end + 1);
  if (tail == 16) {
    cell.label_set = GetFixed64BE(rest.data() + host_end + 9);
    if (cell.label_set == 0) return Corrupt("sample key");  // written without the suffix
  }
  return cell;
}

std::string EncodeCount(uint64_t count) {
  std::string value;
  PutFixed64LE(&value, count);
  return value;
}

absl::StatusOr<uint64_t> DecodeCount(std::string_view value) {
  if (value.size() != 8) return Corrupt("sample count");
  return GetFixed64LE(value.data());
}

std::string EncodeStack(const StackFrames& stack) {
  // Flags (1: truncated, 2: call sites follow), the function IDs, then the call sites (one
  // fewer than functions).
  const bool sites = !stack.call_sites.empty() &&
                     stack.call_sites.size() + 1 == stack.function_ids.size();
  std::string value;
  value.reserve(1 + 16 * stack.function_ids.size());
  value.push_back(static_cast<char>((stack.truncated ? 1 : 0) | (sites ? 2 : 0)));
  for (uint64_t id : stack.function_ids) PutFixed64LE(&value, id);
  if (sites) {
    for (uint64_t site : stack.call_sites) PutFixed64LE(&value, site);
  }
  return value;
}

absl::StatusOr<StackFrames> DecodeStack(std::string_view value) {
  if (value.empty() || (static_cast<uint8_t>(value[0]) & ~3u)) return Corrupt("stack");
  const bool sites = value[0] & 2;
  const size_t words = (value.size() - 1) / 8;
  // With call sites: n functions and n - 1 sites, at least two functions.
  if ((value.size() - 1) % 8 != 0 || (sites && (words < 3 || words % 2 == 0))) {
    return Corrupt("stack");
  }
  const size_t n = sites ? (words + 1) / 2 : words;
  StackFrames stack;
  stack.truncated = value[0] & 1;
  stack.function_ids.reserve(n);
  const char* p = value.data() + 1;
  for (size_t i = 0; i < n; ++i) stack.function_ids.push_back(GetFixed64LE(p + 8 * i));
  if (sites) {
    stack.call_sites.reserve(n - 1);
    for (size_t i = n; i < words; ++i) stack.call_sites.push_back(GetFixed64LE(p + 8 * i));
  }
  return stack;
}

std::string FunctionIdentity(const FunctionInfo& function) {
  std::string identity;
  if (!function.build_id.empty()) {
    identity.push_back('b');
    PutString(&identity, function.build_id);
  } else {
    identity.push_back('m');
    PutString(&identity, function.module);
  }
  PutFixed64LE(&identity, function.start_offset);
  identity.append(function.name);
  return identity;
}

std::string EncodeFunction(const FunctionInfo& function) {
  std::string value;
  value.push_back(1);  // format version
  PutString(&value, function.name);
  PutString(&value, function.module);
  PutString(&value, function.build_id);
  PutFixed64LE(&value, function.start_offset);
  return value;
}

absl::StatusOr<FunctionInfo> DecodeFunction(std::string_view value) {
  Reader in(value);
  uint8_t version;
  FunctionInfo f;
  if (!in.Byte(&version) || version != 1 || !in.String(&f.name) || !in.String(&f.module) ||
      !in.String(&f.build_id) || !in.Fixed64(&f.start_offset) || !in.Done()) {
    return Corrupt("function");
  }
  return f;
}

std::string EncodeServiceSummary(int64_t first_window_ms, int64_t last_window_ms,
                                 uint64_t total) {
  std::string value;
  PutFixed64LE(&value, static_cast<uint64_t>(first_window_ms));
  PutFixed64LE(&value, static_cast<uint64_t>(last_window_ms));
  PutFixed64LE(&value, total);
  return value;
}

absl::StatusOr<ServiceSummary> DecodeServiceSummary(std::string_view value) {
  if (value.size() != 24) return Corrupt("service summary");
  ServiceSummary s;
  s.first_window_ms = static_cast<int64_t>(GetFixed64LE(value.data()));
  s.last_window_ms = static_cast<int64_t>(GetFixed64LE(value.data() + 8));
  s.total_samples = GetFixed64LE(value.data() + 16);
  return s;
}

std::string AgentKey(std::string_view agent_id) { return TaggedKey(kAgentTag, agent_id); }
std::string SequenceKey(std::string_view agent_id, uint64_t incarnation) {
  return TaggedIdKey(kSequenceTag, agent_id, incarnation);
}
std::string LegacySequenceKey(std::string_view agent_id) {
  return TaggedKey(kSequenceTag, agent_id);
}
std::string CaptureKey(std::string_view capture_id) { return TaggedKey(kCaptureTag, capture_id); }
std::string ReleaseKey(std::string_view release_id) { return TaggedKey(kReleaseTag, release_id); }
std::string JournalWrittenKey(std::string_view service) {
  return TaggedKey(kJournalWrittenTag, service);
}

std::string LabelSetKey(uint64_t label_set) {
  std::string key(1, kLabelSetTag);
  PutFixed64BE(&key, label_set);
  return key;
}

std::string ServiceLabelSetPrefix(std::string_view service) {
  std::string key(1, kServiceLabelSetTag);
  key.append(service);
  key.push_back('\0');
  return key;
}

std::string ServiceLabelSetKey(std::string_view service, uint64_t label_set) {
  std::string key = ServiceLabelSetPrefix(service);
  PutFixed64BE(&key, label_set);
  return key;
}

std::string GraphPrefix(std::string_view agent_id, uint64_t graph_id) {
  return TaggedIdKey(kGraphTag, agent_id, graph_id);
}

std::string GraphUseKey(std::string_view agent_id, uint64_t graph_id) {
  return TaggedIdKey(kGraphUseTag, agent_id, graph_id);
}

std::string GraphNodeKey(std::string_view agent_id, uint64_t graph_id, uint64_t node_id) {
  std::string key = GraphPrefix(agent_id, graph_id);
  key.push_back('n');
  PutFixed64BE(&key, node_id);
  return key;
}

std::string GraphEdgeKey(std::string_view agent_id, uint64_t graph_id, uint64_t index) {
  std::string key = GraphPrefix(agent_id, graph_id);
  key.push_back('e');
  PutFixed64BE(&key, index);
  return key;
}

namespace {
// tag service '\0' BE(window): the per-service, per-window meta records' common prefix.
std::string ServiceWindowPrefix(char tag, std::string_view service, uint64_t window_start_ms) {
  std::string key = TaggedKey(tag, service);
  key.push_back('\0');
  PutFixed64BE(&key, window_start_ms);
  return key;
}
}  // namespace

std::string PhasePrefix(std::string_view service, uint64_t window_start_ms) {
  return ServiceWindowPrefix(kPhaseTag, service, window_start_ms);
}

std::string PhaseKey(const PhaseEvent& event) {
  std::string key = PhasePrefix(event.service, static_cast<uint64_t>(event.window_start_ms));
  PutFixed64BE(&key, Hash64(event.payload, 0));
  return key;
}

std::string UnwindPrefix(std::string_view service, uint64_t window_start_ms) {
  return ServiceWindowPrefix(kUnwindTag, service, window_start_ms);
}

std::string UnwindKey(std::string_view service, uint64_t window_start_ms,
                      std::string_view agent_id, uint64_t incarnation, uint64_t sequence) {
  std::string key = UnwindPrefix(service, window_start_ms);
  key.append(agent_id);
  key.push_back('\0');
  PutFixed64BE(&key, incarnation);
  PutFixed64BE(&key, sequence);
  return key;
}

std::string LeafAddressPrefix(std::string_view service, uint64_t window_start_ms) {
  return ServiceWindowPrefix(kLeafAddressTag, service, window_start_ms);
}

namespace {
// (tag, service, window) then host, agent, incarnation and sequence.
std::string BatchHostKey(char tag, std::string_view service, uint64_t window_start_ms,
                         std::string_view host, std::string_view agent_id,
                         uint64_t incarnation, uint64_t sequence) {
  std::string key = ServiceWindowPrefix(tag, service, window_start_ms);
  key.append(host);
  key.push_back('\0');
  key.append(agent_id);
  key.push_back('\0');
  PutFixed64BE(&key, incarnation);
  PutFixed64BE(&key, sequence);
  return key;
}

std::string HourHostKey(char tag, std::string_view service, uint64_t hour_start_ms,
                        std::string_view host) {
  std::string key = ServiceWindowPrefix(tag, service, hour_start_ms);
  key.append(host);
  key.push_back('\0');
  return key;
}
}  // namespace

std::string LeafAddressKey(std::string_view service, uint64_t window_start_ms,
                           std::string_view host, std::string_view agent_id,
                           uint64_t incarnation, uint64_t sequence) {
  return BatchHostKey(kLeafAddressTag, service, window_start_ms, host, agent_id, incarnation,
                      sequence);
}

std::string RequestsPrefix(std::string_view service, uint64_t window_start_ms) {
  return ServiceWindowPrefix(kRequestsTag, service, window_start_ms);
}

std::string RequestsKey(std::string_view service, uint64_t window_start_ms,
                        std::string_view host, std::string_view agent_id, uint64_t incarnation,
                        uint64_t sequence) {
  return BatchHostKey(kRequestsTag, service, window_start_ms, host, agent_id, incarnation,
                      sequence);
}

std::string RequestsHourPrefix(std::string_view service, uint64_t hour_start_ms) {
  return ServiceWindowPrefix(kRequestsHourTag, service, hour_start_ms);
}

std::string RequestsHourKey(std::string_view service, uint64_t hour_start_ms,
                            std::string_view host) {
  return HourHostKey(kRequestsHourTag, service, hour_start_ms, host);
}

std::string LeafAddressHourPrefix(std::string_view service, uint64_t hour_start_ms) {
  return ServiceWindowPrefix(kLeafAddressHourTag, service, hour_start_ms);
}

std::string LeafAddressHourKey(std::string_view service, uint64_t hour_start_ms,
                               std::string_view host) {
  return HourHostKey(kLeafAddressHourTag, service, hour_start_ms, host);
}

std::string LeafAddressHoursSinceKey() { return std::string(1, kRollupStateTag) + "leaf-address-hours"; }

absl::StatusOr<std::string_view> LeafAddressKeyHost(std::string_view key) {
  // tag, service, NUL, 8-byte window, then the host up to its NUL.
  const size_t service_end = key.find('\0', 1);
  if (key.empty() ||
      (key[0] != kLeafAddressTag && key[0] != kLeafAddressHourTag && key[0] != kRequestsTag &&
       key[0] != kRequestsHourTag) ||
      service_end == std::string_view::npos ||
      key.size() < service_end + 9) {
    return Corrupt("leaf address key");
  }
  std::string_view rest = key.substr(service_end + 9);
  const size_t host_end = rest.find('\0');
  if (host_end == std::string_view::npos) return Corrupt("leaf address key");
  return rest.substr(0, host_end);
}

namespace {
std::optional<uint64_t> ServiceWindowStart(std::string_view key) {
  const size_t service_end = key.find('\0', 1);
  if (service_end == std::string_view::npos || key.size() < service_end + 9) return std::nullopt;
  return GetFixed64BE(key.data() + service_end + 1);
}
}  // namespace

std::optional<uint64_t> BatchMetaWindowStart(std::string_view key) {
  if (key.empty() ||
      (key[0] != kUnwindTag && key[0] != kLeafAddressTag && key[0] != kRequestsTag)) {
    return std::nullopt;
  }
  return ServiceWindowStart(key);
}

std::optional<uint64_t> HourlyMetaWindowStart(std::string_view key) {
  if (key.empty() || (key[0] != kLeafAddressHourTag && key[0] != kRequestsHourTag)) {
    return std::nullopt;
  }
  return ServiceWindowStart(key);
}

std::string EncodeLeafAddresses(const std::vector<LeafAddressCount>& counts) {
  std::string value(1, 1);
  PutVarint(&value, counts.size());
  for (const LeafAddressCount& c : counts) {
    PutVarint(&value, c.function_id);
    PutVarint(&value, c.offset);
    PutVarint(&value, c.count);
  }
  return value;
}

absl::StatusOr<std::vector<LeafAddressCount>> DecodeLeafAddresses(std::string_view value) {
  Reader in(value);
  uint8_t version;
  uint64_t n;
  if (!in.Byte(&version) || version != 1 || !in.Varint(&n) || n > value.size()) {
    return Corrupt("leaf addresses");
  }
  std::vector<LeafAddressCount> out(n);
  for (LeafAddressCount& c : out) {
    if (!in.Varint(&c.function_id) || !in.Varint(&c.offset) || !in.Varint(&c.count)) {
      return Corrupt("leaf addresses");
    }
  }
  if (!in.Done()) return Corrupt("leaf addresses");
  return out;
}

namespace {
// Version 1's fields, then version 2's.
constexpr uint64_t UnwindCounts::*kUnwindFields[] = {
    &UnwindCounts::stacks,         &UnwindCounts::truncated,     &UnwindCounts::verify_failures,
    &UnwindCounts::jit_frames_cfi, &UnwindCounts::jit_frames_fp, &UnwindCounts::lost,
    &UnwindCounts::python_frames,  &UnwindCounts::python_stale};
constexpr size_t kUnwindFieldsV1 = 6;
}  // namespace

void UnwindCounts::Add(const UnwindCounts& o) {
  for (uint64_t UnwindCounts::*f : kUnwindFields) {
    this->*f = this->*f + o.*f < this->*f ? UINT64_MAX : this->*f + o.*f;
  }
}

std::string EncodeUnwindCounts(const UnwindCounts& counts) {
  std::string value(1, 2);
  for (uint64_t UnwindCounts::*f : kUnwindFields) PutVarint(&value, counts.*f);
  return value;
}

absl::StatusOr<UnwindCounts> DecodeUnwindCounts(std::string_view value) {
  Reader in(value);
  uint8_t version;
  UnwindCounts c;
  if (!in.Byte(&version) || version == 0) return Corrupt("unwind counters");
  const size_t fields = version == 1 ? kUnwindFieldsV1 : std::size(kUnwindFields);
  for (size_t i = 0; i < fields; ++i) {
    if (!in.Varint(&(c.*kUnwindFields[i]))) return Corrupt("unwind counters");
  }
  // Fields a later version appends are skipped; versions 1 and 2 have none.
  if (version <= 2 && !in.Done()) return Corrupt("unwind counters");
  return c;
}

std::string EncodeAgent(const AgentRecord& agent) {
  // Version 2 adds the owner; version 1 records (no owner) still decode.
  std::string value;
  value.push_back(2);
  PutString(&value, agent.host);
  PutString(&value, agent.arch);
  PutString(&value, agent.version);
  PutFixed64LE(&value, static_cast<uint64_t>(agent.last_batch_ms));
  PutVarint(&value, agent.batches);
  PutString(&value, agent.owner);
  return value;
}

absl::StatusOr<AgentRecord> DecodeAgent(std::string_view value) {
  Reader in(value);
  uint8_t version;
  uint64_t last_batch;
  AgentRecord a;
  if (!in.Byte(&version) || (version != 1 && version != 2) || !in.String(&a.host) ||
      !in.String(&a.arch) || !in.String(&a.version) || !in.Fixed64(&last_batch) ||
      !in.Varint(&a.batches) || (version == 2 && !in.String(&a.owner)) || !in.Done()) {
    return Corrupt("agent");
  }
  a.last_batch_ms = static_cast<int64_t>(last_batch);
  return a;
}

std::string EncodeGraphNode(const GraphNode& node) {
  std::string value;
  PutString(&value, node.name);
  PutString(&value, node.module);
  PutString(&value, node.build_id);
  PutVarint(&value, node.start_offset);
  return value;
}

absl::StatusOr<GraphNode> DecodeGraphNode(std::string_view value) {
  Reader in(value);
  GraphNode n;
  if (!in.String(&n.name) || !in.String(&n.module) || !in.String(&n.build_id) ||
      !in.Varint(&n.start_offset) || !in.Done()) {
    return Corrupt("graph node");
  }
  return n;
}

std::string EncodeGraphEdge(const GraphEdge& edge) {
  std::string value;
  PutVarint(&value, edge.caller);
  PutVarint(&value, edge.call_site);
  PutVarint(&value, edge.callee);
  if (edge.back.has_value()) PutVarint(&value, *edge.back ? 1 : 0);
  return value;
}

absl::StatusOr<GraphEdge> DecodeGraphEdge(std::string_view value) {
  Reader in(value);
  GraphEdge e;
  if (!in.Varint32(&e.caller) || !in.Varint(&e.call_site) || !in.Varint32(&e.callee)) {
    return Corrupt("graph edge");
  }
  if (!in.Done()) {
    uint32_t back = 0;
    if (!in.Varint32(&back) || back > 1 || !in.Done()) return Corrupt("graph edge");
    e.back = back == 1;
  }
  return e;
}

std::string EncodeCapture(const CaptureInfo& c) {
  std::string value;
  value.push_back(1);
  PutString(&value, c.service);
  PutString(&value, c.host);
  PutVarint(&value, c.pid);
  PutVarint(&value, c.frequency_hz);
  PutFixed64LE(&value, static_cast<uint64_t>(c.start_ms));
  PutFixed64LE(&value, static_cast<uint64_t>(c.end_ms));
  value.push_back(c.finished ? 1 : 0);
  PutString(&value, c.error);
  return value;
}

std::string EncodeRelease(const ReleaseRecord& release) {
  std::string value;
  value.push_back(1);
  PutString(&value, release.payload);
  return value;
}

absl::StatusOr<ReleaseRecord> DecodeRelease(std::string_view value) {
  Reader in(value);
  uint8_t version;
  ReleaseRecord r;
  if (!in.Byte(&version) || version != 1 || !in.String(&r.payload) || !in.Done()) {
    return Corrupt("release");
  }
  return r;
}

absl::StatusOr<CaptureInfo> DecodeCapture(std::string_view value) {
  Reader in(value);
  uint8_t version, finished;
  uint64_t start, end;
  CaptureInfo c;
  if (!in.Byte(&version) || version != 1 || !in.String(&c.service) || !in.String(&c.host) ||
      !in.Varint32(&c.pid) || !in.Varint32(&c.frequency_hz) || !in.Fixed64(&start) ||
      !in.Fixed64(&end) || !in.Byte(&finished) || finished > 1 || !in.String(&c.error) ||
      !in.Done()) {
    return Corrupt("capture");
  }
  c.start_ms = static_cast<int64_t>(start);
  c.end_ms = static_cast<int64_t>(end);
  c.finished = finished == 1;
  return c;
}

}  // namespace strata::server::store
