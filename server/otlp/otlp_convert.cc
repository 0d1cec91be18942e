#include "server/otlp/otlp_convert.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string_view>
#include <tuple>
#include "absl/strings/string_view.h"
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/frame_kind.h"
#include "common/base/saturating.h"
#include "server/commit/batch_committer.h"
#include "server/commit/profile_type.h"

namespace strata::server::otlp {
namespace {

// 2000-01-01T00:00:00Z: samples timed before it are refused (see where it is checked).
constexpr int64_t kEarliestSampleMs = 946'684'800'000;

using ::opentelemetry::proto::common::v1::AnyValue;
using ::opentelemetry::proto::common::v1::KeyValue;
using profiles_v1::Location;
using profiles_v1::Profile;
using profiles_v1::ProfilesDictionary;
using profiles_v1::ResourceProfiles;
using profiles_v1::Sample;

constexpr absl::string_view kServiceName = "service.name";
constexpr absl::string_view kHostName = "host.name";
constexpr absl::string_view kExecutableName = "process.executable.name";
constexpr absl::string_view kFrameType = "profile.frame.type";
constexpr absl::string_view kGnuBuildId = "process.executable.build_id.gnu";
constexpr absl::string_view kUnknown = "[unknown]";

// Attributes that name a process or thread rather than what runs: as labels every process
// would be a series of its own (and the service's --max-label-sets would overflow).
bool DroppedAttribute(absl::string_view key) {
  return key == kServiceName || key == kHostName || key == "process.pid" ||
         key == "process.parent_pid" || key == "process.command_line" ||
         key == "process.command_args" || key == "process.command" ||
         absl::StartsWith(key, "thread.");
}

// frame_kind.h speaks std::string_view.
std::string_view Std(absl::string_view s) { return std::string_view(s.data(), s.size()); }

absl::string_view BaseName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

// Attribute key -> its value as label text (lists and maps are not labels).
using Attributes = std::map<std::string, std::string, std::less<>>;

class Converter {
 public:
  Converter(const ProfilesDictionary& dictionary, const ingest::IngestLimits& limits,
            const std::string& forced_host, int64_t now_ms)
      : dict_(dictionary), limits_(limits), forced_host_(forced_host), now_ms_(now_ms) {}

  absl::Status AddResource(const ResourceProfiles& resource, int index);
  absl::StatusOr<ConvertedRequest> Finish();

 private:
  // Where a value lands before its conversion to sampling periods.
  struct RawKey {
    uint32_t context;
    int64_t window_start_ms;
    uint32_t stack;
    int64_t period_ns;  // 0: the value is a count already
    bool operator==(const RawKey&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const RawKey& k) {
      return H::combine(std::move(h), k.context, k.window_start_ms, k.stack, k.period_ns);
    }
  };
  // Where a CPU sample's leaf line lands: its stack's leaf function at `line`.
  struct LeafLineKey {
    uint32_t context;
    int64_t window_start_ms;
    uint32_t function;
    uint32_t line;
    int64_t period_ns;
    bool operator==(const LeafLineKey&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const LeafLineKey& k) {
      return H::combine(std::move(h), k.context, k.window_start_ms, k.function, k.line,
                        k.period_ns);
    }
  };
  // An OTLP stack as converted: its stack, and its leaf's line where the leaf's offsets are
  // lines (a Python or Java function), else 0.
  struct StackOfIndex {
    uint32_t stack = 0;
    uint32_t leaf_line = 0;
  };
  struct Context {
    std::string service;
    std::string host;
    labels::LabelSet labels;
  };

  absl::StatusOr<absl::string_view> String(int32_t index, absl::string_view field) const;
  absl::StatusOr<std::string> ValueText(const AnyValue& value, absl::string_view field) const;
  absl::Status AddKeyValues(const google::protobuf::RepeatedPtrField<KeyValue>& kvs,
                            absl::string_view field, Attributes* out) const;
  absl::Status AddIndexedAttributes(const google::protobuf::RepeatedField<int32_t>& indices,
                                    absl::string_view field, Attributes* out) const;
  // The attribute `key` among `indices` (empty when absent or not a scalar).
  absl::StatusOr<std::string> FindAttribute(const google::protobuf::RepeatedField<int32_t>& indices,
                                            absl::string_view key, absl::string_view field) const;
  absl::StatusOr<uint32_t> ContextOf(const Attributes& attributes, v1::ProfileType type);
  absl::Status AddProfile(const Profile& profile, const Attributes& resource_attributes,
                          absl::string_view field);
  absl::StatusOr<StackOfIndex> StackOf(int32_t stack_index);
  // Frames leaf first, and each one's line where its function's offsets are lines
  // (common/base/frame_kind.h), else 0.
  struct Frames {
    std::vector<uint32_t> leaf_first;
    std::vector<uint32_t> lines;
  };
  // A location's frames, innermost first: `size` of location_frames_ from `begin`, converted
  // once per location (a request may name one location in every stack, and its attributes
  // each time); `abort`: the sender's marker of an unwinding stop.
  struct LocationFrames {
    uint32_t begin = 0;
    uint32_t size = 0;
    bool converted = false;
    bool abort = false;
  };
  // Appends `location`'s frames to `frames`, innermost first.
  absl::Status AddLocationFrames(int32_t location_index, Frames* frames, bool* truncated);
  // Appends the location's frames to location_frames_; `abort` for the sender's marker of an
  // unwinding stop.
  absl::Status ConvertLocation(int32_t location_index, bool* abort);
  // The build ID of a mapping (once per mapping, as for locations; valid as long as the
  // converter).
  absl::StatusOr<absl::string_view> BuildIdOf(int32_t mapping_index, absl::string_view field);
  // A location line's function, and whether its offsets are lines.
  struct LineFunction {
    uint32_t function;
    bool offsets_are_lines;
  };
  absl::StatusOr<LineFunction> LineFunctionOf(const profiles_v1::Function& function,
                                              absl::string_view kind,
                                              absl::string_view mapping_file,
                                              absl::string_view build_id, absl::string_view field);
  absl::StatusOr<uint32_t> FunctionOf(store::FunctionInfo info, absl::string_view field);

  const ProfilesDictionary& dict_;
  const ingest::IngestLimits& limits_;
  const std::string& forced_host_;
  const int64_t now_ms_;

  ConvertedRequest out_;
  absl::flat_hash_map<std::string, uint32_t> function_ids_;
  absl::flat_hash_map<std::string, uint32_t> stack_ids_;         // by frames
  absl::flat_hash_map<int32_t, StackOfIndex> stack_of_index_;    // by Stack table index
  std::vector<LocationFrames> locations_;  // by location index
  Frames location_frames_;                 // every converted location's, one after another
  absl::node_hash_map<int32_t, std::string> build_ids_;  // by mapping index (stable values)
  // The lowercased frame type of locations with one attribute, by its attribute index.
  absl::flat_hash_map<int32_t, std::string> kinds_;
  // Converted location lines' functions by (function index, mapping index, the location's
  // one attribute index or -1 for none): most locations of a request repeat a function (one
  // per call site), whose name and module need building once.
  absl::flat_hash_map<std::tuple<int32_t, int32_t, int32_t>, LineFunction> line_functions_;
  std::string location_field_;  // scratch: "location N", for errors
  size_t decoded_frames_ = 0;  // of the stack table entries converted, against kMaxRequestFrames
  std::vector<Context> contexts_;
  absl::flat_hash_map<std::string, uint32_t> context_ids_;
  absl::flat_hash_set<std::string> services_;
  absl::flat_hash_map<RawKey, uint64_t> raw_;
  absl::flat_hash_map<LeafLineKey, uint64_t> leaf_line_raw_;
  absl::flat_hash_set<uint32_t> recursive_;  // scratch
  std::vector<uint64_t> call_sites_;         // scratch
  Frames stack_frames_scratch_;              // StackOf's
};

absl::StatusOr<absl::string_view> Converter::String(int32_t index, absl::string_view field) const {
  if (index < 0 || index >= dict_.string_table_size()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": string index ", index,
                                                   " outside the string table (",
                                                   dict_.string_table_size(), " entries)"));
  }
  return absl::string_view(dict_.string_table(index));
}

absl::StatusOr<std::string> Converter::ValueText(const AnyValue& value,
                                                 absl::string_view field) const {
  switch (value.value_case()) {
    case AnyValue::kStringValue: return value.string_value();
    case AnyValue::kStringValueStrindex: {
      auto s = String(value.string_value_strindex(), field);
      if (!s.ok()) return s.status();
      return std::string(*s);
    }
    case AnyValue::kBoolValue: return std::string(value.bool_value() ? "true" : "false");
    case AnyValue::kIntValue: return absl::StrCat(value.int_value());
    case AnyValue::kDoubleValue: return absl::StrCat(value.double_value());
    case AnyValue::kBytesValue: return absl::BytesToHexString(value.bytes_value());
    default: return std::string();  // lists, maps, unset: not a label
  }
}

absl::Status Converter::AddKeyValues(const google::protobuf::RepeatedPtrField<KeyValue>& kvs,
                                     absl::string_view field, Attributes* out) const {
  for (const KeyValue& kv : kvs) {
    std::string key = kv.key();
    if (key.empty() && kv.key_strindex() != 0) {
      auto s = String(kv.key_strindex(), field);
      if (!s.ok()) return s.status();
      key = std::string(*s);
    }
    auto text = ValueText(kv.value(), field);
    if (!text.ok()) return text.status();
    if (!key.empty() && !text->empty()) (*out)[key] = *std::move(text);
  }
  return absl::OkStatus();
}

absl::Status Converter::AddIndexedAttributes(
    const google::protobuf::RepeatedField<int32_t>& indices, absl::string_view field,
    Attributes* out) const {
  for (int32_t i : indices) {
    if (i < 0 || i >= dict_.attribute_table_size()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": attribute index ", i,
                                                     " outside the attribute table (",
                                                     dict_.attribute_table_size(), " entries)"));
    }
    const auto& attribute = dict_.attribute_table(i);
    auto key = String(attribute.key_strindex(), field);
    if (!key.ok()) return key.status();
    auto text = ValueText(attribute.value(), field);
    if (!text.ok()) return text.status();
    if (!key->empty() && !text->empty()) (*out)[std::string(*key)] = *std::move(text);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Converter::FindAttribute(
    const google::protobuf::RepeatedField<int32_t>& indices, absl::string_view key,
    absl::string_view field) const {
  Attributes attributes;
  if (absl::Status s = AddIndexedAttributes(indices, field, &attributes); !s.ok()) return s;
  auto it = attributes.find(key);
  return it == attributes.end() ? std::string() : it->second;
}

absl::StatusOr<uint32_t> Converter::ContextOf(const Attributes& attributes,
                                              v1::ProfileType type) {
  Context context;
  auto service = attributes.find(kServiceName);
  if (service != attributes.end()) {
    context.service = service->second;
  } else if (auto exe = attributes.find(kExecutableName); exe != attributes.end()) {
    context.service = absl::StrCat("unknown_service:", exe->second);  // OTel's convention
  } else {
    context.service = "unknown_service";
  }
  auto host = attributes.find(kHostName);
  context.host = host != attributes.end() ? host->second : forced_host_;
  if (context.host.empty()) context.host = "unknown";
  if (!forced_host_.empty() && context.host != forced_host_) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this client certificate may write only as host ", forced_host_, ", not as host.name ",
        context.host));
  }
  if (!ingest::ValidKeyPart(context.service, limits_.max_id_bytes) ||
      !ingest::ValidKeyPart(context.host, limits_.max_id_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "service.name and host.name must have 1 to ", limits_.max_id_bytes,
        " bytes and no NUL"));
  }
  for (const auto& [key, value] : attributes) {
    if (DroppedAttribute(key)) continue;
    if (commit::IsReservedLabelKey(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("attribute ", key, ": keys starting with \"__\" are reserved"));
    }
    if (absl::Status s = labels::ValidateLabel(key, value); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("attribute ", key, ": ", s.message()));
    }
    context.labels.emplace_back(key, value);  // sorted: `attributes` is an ordered map
  }
  if (context.labels.size() > limits_.max_labels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a sample has ", context.labels.size(), " attributes for labels, more than ",
        limits_.max_labels));
  }
  context.labels = labels::Merge(context.labels, commit::ProfileLabels(type));
  std::string key = absl::StrCat(context.service, std::string(1, '\0'), context.host,
                                 std::string(1, '\0'), labels::Encode(context.labels));
  if (auto it = context_ids_.find(key); it != context_ids_.end()) return it->second;
  if (services_.insert(context.service).second &&
      services_.size() > limits_.max_batch_services) {
    return absl::InvalidArgumentError(absl::StrCat("the request has more than ",
                                                   limits_.max_batch_services, " services"));
  }
  const uint32_t id = static_cast<uint32_t>(contexts_.size());
  contexts_.push_back(std::move(context));
  context_ids_.emplace(std::move(key), id);
  return id;
}

absl::StatusOr<uint32_t> Converter::FunctionOf(store::FunctionInfo info, absl::string_view field) {
  if (info.name.size() > limits_.max_name_bytes || info.module.size() > limits_.max_path_bytes ||
      info.build_id.size() > limits_.max_id_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": a function name, file or build ID is longer than the limits (",
        limits_.max_name_bytes, ", ", limits_.max_path_bytes, ", ", limits_.max_id_bytes,
        " bytes)"));
  }
  std::string key = absl::StrCat(info.name, std::string(1, '\0'), info.module,
                                 std::string(1, '\0'), info.build_id, std::string(1, '\0'),
                                 info.start_offset);
  if (auto it = function_ids_.find(key); it != function_ids_.end()) return it->second;
  const uint32_t id = static_cast<uint32_t>(out_.functions.size());
  out_.functions.push_back(std::move(info));
  function_ids_.emplace(std::move(key), id);
  return id;
}

// The module name that carries a frame's kind (common/base/frame_kind.h).
std::string ModuleFor(absl::string_view kind, absl::string_view mapping_file,
                      absl::string_view function_file) {
  if (kind == "kernel") {
    if (mapping_file.empty() || mapping_file == "vmlinux" ||
        base::FrameKindOf(Std(mapping_file)) == base::FrameKind::kKernel) {
      return mapping_file.empty() || mapping_file == "vmlinux" ? std::string(base::kKernelModule)
                                                               : std::string(mapping_file);
    }
    return base::KernelModuleName(Std(mapping_file));
  }
  if (kind == "cpython" || kind == "python") return base::PythonModuleName(Std(function_file));
  // A Java method with its source file, as the agent names one; without, code of its runtime.
  if ((kind == "jvm" || kind == "hotspot") && !function_file.empty()) {
    return base::JavaModuleName(Std(function_file));
  }
  if (kind == "jvm" || kind == "hotspot" || kind == "v8js" || kind == "dotnet" ||
      kind == "beam") {
    return base::JitModuleName(Std(kind));
  }
  if (kind.empty() || kind == "native" || kind == "go" || kind == "rust") {
    if (!mapping_file.empty()) return std::string(mapping_file);
    return std::string(function_file.empty() ? kUnknown : function_file);
  }
  return absl::StrCat("[", kind, ":", function_file, "]");
}

absl::Status Converter::AddLocationFrames(int32_t location_index, Frames* frames,
                                          bool* truncated) {
  if (location_index < 0 || location_index >= dict_.location_table_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stack: location index ", location_index, " outside the location table (",
        dict_.location_table_size(), " entries)"));
  }
  if (locations_.empty()) locations_.resize(dict_.location_table_size());
  LocationFrames& location = locations_[location_index];
  if (!location.converted) {
    location.begin = static_cast<uint32_t>(location_frames_.leaf_first.size());
    if (absl::Status s = ConvertLocation(location_index, &location.abort); !s.ok()) return s;
    location.size = static_cast<uint32_t>(location_frames_.leaf_first.size()) - location.begin;
    location.converted = true;
  }
  if (location.abort) *truncated = true;
  const auto from = [&](const std::vector<uint32_t>& v) { return v.begin() + location.begin; };
  frames->leaf_first.insert(frames->leaf_first.end(), from(location_frames_.leaf_first),
                            from(location_frames_.leaf_first) + location.size);
  frames->lines.insert(frames->lines.end(), from(location_frames_.lines),
                       from(location_frames_.lines) + location.size);
  return absl::OkStatus();
}

absl::StatusOr<absl::string_view> Converter::BuildIdOf(int32_t mapping_index,
                                                       absl::string_view field) {
  if (auto it = build_ids_.find(mapping_index); it != build_ids_.end()) return it->second;
  auto build_id =
      FindAttribute(dict_.mapping_table(mapping_index).attribute_indices(), kGnuBuildId, field);
  if (!build_id.ok()) return build_id.status();
  return build_ids_.emplace(mapping_index, *std::move(build_id)).first->second;
}

absl::StatusOr<Converter::LineFunction> Converter::LineFunctionOf(
    const profiles_v1::Function& function, absl::string_view kind, absl::string_view mapping_file,
    absl::string_view build_id, absl::string_view field) {
  auto name = String(function.name_strindex(), field);
  if (!name.ok()) return name.status();
  if (name->empty()) name = String(function.system_name_strindex(), field);
  if (!name.ok()) return name.status();
  auto file = String(function.filename_strindex(), field);
  if (!file.ok()) return file.status();
  std::string module = ModuleFor(kind, mapping_file, *file);
  const bool offsets_are_lines = base::OffsetsAreLines(base::FrameKindOf(module));
  auto fn = FunctionOf({std::string(name->empty() ? kUnknown : *name), std::move(module),
                        std::string(build_id), 0},
                       field);
  if (!fn.ok()) return fn.status();
  return LineFunction{*fn, offsets_are_lines};
}

absl::Status Converter::ConvertLocation(int32_t location_index, bool* abort) {
  std::vector<uint32_t>* leaf_first = &location_frames_.leaf_first;
  std::vector<uint32_t>* lines = &location_frames_.lines;
  const Location& location = dict_.location_table(location_index);
  location_field_.assign("location ");
  absl::StrAppend(&location_field_, location_index);
  const absl::string_view field = location_field_;
  // Locations share their few frame-type attributes: a location with one (or none) has its
  // kind, and its lines' functions, converted once per request; one with more on its own.
  const int attribute_count = location.attribute_indices_size();
  const bool shared = attribute_count <= 1;
  const int32_t kind_key = attribute_count == 1 ? location.attribute_indices(0) : -1;
  auto cached_kind = shared ? kinds_.find(kind_key) : kinds_.end();
  absl::StatusOr<std::string> kind;
  if (cached_kind != kinds_.end()) {
    kind = cached_kind->second;
  } else {
    kind = FindAttribute(location.attribute_indices(), kFrameType, field);
    if (!kind.ok()) return kind.status();
    absl::AsciiStrToLower(&*kind);
    if (shared) kinds_.emplace(kind_key, *kind);
  }
  if (absl::StartsWith(*kind, "abort")) {  // the eBPF profiler's marker of an unwinding stop
    *abort = true;
    return absl::OkStatus();
  }
  if (location.mapping_index() < 0 || location.mapping_index() >= dict_.mapping_table_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": mapping index ", location.mapping_index(), " outside the mapping table (",
        dict_.mapping_table_size(), " entries)"));
  }
  const auto& mapping = dict_.mapping_table(location.mapping_index());
  auto mapping_file = String(mapping.filename_strindex(), field);
  if (!mapping_file.ok()) return mapping_file.status();
  auto build_id = BuildIdOf(location.mapping_index(), field);
  if (!build_id.ok()) return build_id.status();
  const bool native = kind->empty() || *kind == "native" || *kind == "go" || *kind == "rust";
  if (location.lines().empty()) {
    // Not symbolized by the sender: named like the agents name code without symbols.
    const bool in_mapping = mapping.memory_limit() > mapping.memory_start() &&
                            location.address() >= mapping.memory_start() &&
                            location.address() < mapping.memory_limit();
    const uint64_t offset = in_mapping
                                ? location.address() - mapping.memory_start() + mapping.file_offset()
                                : location.address();
    const std::string module = ModuleFor(*kind, *mapping_file, "");
    absl::string_view base = mapping_file->empty() ? absl::string_view(module) : BaseName(*mapping_file);
    auto fn = FunctionOf({absl::StrFormat("%s+0x%x", base, offset), module,
                          native ? std::string(*build_id) : std::string(), offset},
                         field);
    if (!fn.ok()) return fn.status();
    leaf_first->push_back(*fn);
    lines->push_back(0);
    return absl::OkStatus();
  }
  for (const auto& line : location.lines()) {  // innermost (inlined) first
    if (line.function_index() < 0 || line.function_index() >= dict_.function_table_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": function index ", line.function_index(), " outside the function table (",
          dict_.function_table_size(), " entries)"));
    }
    const auto cache_key = std::tuple{line.function_index(), location.mapping_index(), kind_key};
    auto cached = shared ? line_functions_.find(cache_key) : line_functions_.end();
    absl::StatusOr<LineFunction> function =
        cached != line_functions_.end()
            ? cached->second
            : LineFunctionOf(dict_.function_table(line.function_index()), *kind, *mapping_file,
                             native ? *build_id : absl::string_view(), field);
    if (!function.ok()) return function.status();
    if (shared && cached == line_functions_.end()) line_functions_.emplace(cache_key, *function);
    leaf_first->push_back(function->function);
    // A line past what the agents' offsets hold is not known.
    lines->push_back(function->offsets_are_lines && line.line() > 0 && line.line() < UINT32_MAX
                         ? static_cast<uint32_t>(line.line())
                         : 0);
  }
  return absl::OkStatus();
}

absl::StatusOr<Converter::StackOfIndex> Converter::StackOf(int32_t stack_index) {
  if (auto it = stack_of_index_.find(stack_index); it != stack_of_index_.end()) return it->second;
  if (stack_index < 0 || stack_index >= dict_.stack_table_size()) {
    return absl::InvalidArgumentError(absl::StrCat("sample: stack index ", stack_index,
                                                   " outside the stack table (",
                                                   dict_.stack_table_size(), " entries)"));
  }
  ConvertedStack stack;
  Frames& frames = stack_frames_scratch_;
  frames.leaf_first.clear();
  frames.lines.clear();
  for (int32_t location : dict_.stack_table(stack_index).location_indices()) {
    if (absl::Status s = AddLocationFrames(location, &frames, &stack.truncated); !s.ok()) {
      return s;
    }
    if (frames.leaf_first.size() > kMaxStackFrames) {
      return absl::InvalidArgumentError(absl::StrCat("stack ", stack_index, " has more than ",
                                                     kMaxStackFrames, " frames"));
    }
  }
  if (frames.leaf_first.empty()) {  // no frames: its samples still count
    auto fn = FunctionOf({std::string(kUnknown), std::string(kUnknown), "", 0}, "stack");
    if (!fn.ok()) return fn.status();
    frames.leaf_first.push_back(*fn);
    frames.lines.push_back(0);
  }
  // Every stack table entry the samples name is decoded (once), whatever it decodes to:
  // entries that repeat one stack cost as much as distinct ones.
  if (frames.leaf_first.size() > kMaxRequestFrames - decoded_frames_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "stack ", stack_index, ": the request's stacks have more than ", kMaxRequestFrames,
        " frames in all"));
  }
  decoded_frames_ += frames.leaf_first.size();
  stack.functions.assign(frames.leaf_first.rbegin(), frames.leaf_first.rend());  // outermost first
  // A caller's call site is its line + 1, as the agents send a Python or Java caller's (a
  // return address follows its call); the leaf's line is where its samples were.
  // Kept only where one is known: most stacks have none, and a request may hold millions of
  // frames.
  call_sites_.resize(stack.functions.size() - 1);
  for (size_t i = 0; i + 1 < stack.functions.size(); ++i) {
    const uint32_t line = frames.lines[frames.lines.size() - 1 - i];
    call_sites_[i] = line == 0 ? 0 : uint64_t{line} + 1;
  }
  auto any_known = [this] {
    return std::any_of(call_sites_.begin(), call_sites_.end(), [](uint64_t s) { return s != 0; });
  };
  if (any_known()) {  // native stacks have none: no recursion check for them
    store::ZeroCallSitesInRecursion(stack.functions, call_sites_, recursive_);
    if (any_known()) stack.call_sites = call_sites_;
  }
  const uint32_t depth = static_cast<uint32_t>(stack.functions.size());
  std::string key(reinterpret_cast<const char*>(&depth), sizeof depth);
  key.append(reinterpret_cast<const char*>(stack.functions.data()),
             stack.functions.size() * sizeof(uint32_t));
  key.append(reinterpret_cast<const char*>(stack.call_sites.data()),
             stack.call_sites.size() * sizeof(uint64_t));
  key.push_back(stack.truncated ? 't' : 'c');
  auto [it, added] = stack_ids_.emplace(std::move(key), static_cast<uint32_t>(out_.stacks.size()));
  if (added) out_.stacks.push_back(std::move(stack));
  const StackOfIndex converted{it->second, frames.lines.front()};
  stack_of_index_.emplace(stack_index, converted);
  return converted;
}

absl::Status Converter::AddProfile(const Profile& profile, const Attributes& resource_attributes,
                                   absl::string_view field) {
  auto type = String(profile.sample_type().type_strindex(), field);
  if (!type.ok()) return type.status();
  auto unit = String(profile.sample_type().unit_strindex(), field);
  if (!unit.ok()) return unit.status();
  auto profile_type = ProfileTypeOf(*type, *unit);
  if (!profile_type.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", profile_type.status().message()));
  }
  int64_t period_ns = 0;
  if (*unit == "nanoseconds") {
    auto period_unit = String(profile.period_type().unit_strindex(), field);
    if (!period_unit.ok()) return period_unit.status();
    period_ns = *period_unit == "nanoseconds" && profile.period() > 0 ? profile.period()
                                                                      : kDefaultPeriodNs;
  }
  Attributes attributes = resource_attributes;
  if (absl::Status s = AddIndexedAttributes(profile.attribute_indices(), field, &attributes);
      !s.ok()) {
    return s;
  }
  const int64_t profile_ms = profile.time_unix_nano() != 0
                                 ? static_cast<int64_t>(profile.time_unix_nano() / 1'000'000)
                                 : now_ms_;
  // Samples of one profile share few distinct attribute lists: resolve each once.
  absl::flat_hash_map<std::string, uint32_t> context_of_attributes;
  for (int i = 0; i < profile.samples_size(); ++i) {
    const Sample& sample = profile.samples(i);
    const std::string sample_field = absl::StrCat(field, " sample ", i);
    if (sample.values_size() == 0 && sample.timestamps_unix_nano_size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(sample_field, " has neither values nor timestamps"));
    }
    if (sample.values_size() != 0 && sample.timestamps_unix_nano_size() != 0 &&
        sample.values_size() != sample.timestamps_unix_nano_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(sample_field, " has ", sample.values_size(), " values and ",
                       sample.timestamps_unix_nano_size(), " timestamps"));
    }
    // Links (trace spans) are not kept, but an index outside the table is as malformed as
    // any other: 0 is the table's empty entry, valid without a table.
    if (sample.link_index() != 0 &&
        (sample.link_index() < 0 || sample.link_index() >= dict_.link_table_size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(sample_field, ": link index ", sample.link_index(),
                       " outside the link table (", dict_.link_table_size(), " entries)"));
    }
    std::string attributes_key(reinterpret_cast<const char*>(sample.attribute_indices().data()),
                               sample.attribute_indices_size() * sizeof(int32_t));
    uint32_t context;
    if (auto it = context_of_attributes.find(attributes_key); it != context_of_attributes.end()) {
      context = it->second;
    } else {
      Attributes sample_attributes = attributes;
      if (absl::Status s = AddIndexedAttributes(sample.attribute_indices(), sample_field,
                                                &sample_attributes);
          !s.ok()) {
        return s;
      }
      auto id = ContextOf(sample_attributes, *profile_type);
      if (!id.ok()) return id.status();
      context = *id;
      context_of_attributes.emplace(std::move(attributes_key), context);
    }
    auto stack = StackOf(sample.stack_index());
    if (!stack.ok()) return stack.status();
    const int n = std::max(sample.values_size(), sample.timestamps_unix_nano_size());
    for (int j = 0; j < n; ++j) {
      const int64_t value = sample.values_size() == 0 ? 1 : sample.values(j);
      if (value < 0) {
        return absl::InvalidArgumentError(absl::StrCat(sample_field, " has a negative value"));
      }
      const int64_t time_ms =
          sample.timestamps_unix_nano_size() == 0 || sample.timestamps_unix_nano(j) == 0
              ? profile_ms
              : static_cast<int64_t>(sample.timestamps_unix_nano(j) / 1'000'000);
      if (time_ms - now_ms_ > ingest::kMaxAheadOfServerMs) {
        return absl::InvalidArgumentError(absl::StrCat(
            sample_field, ": its time is ", (time_ms - now_ms_) / 1000,
            " s past the server's clock (at most 24 h)"));
      }
      // A time before 2000 is a clock not set or a time in the wrong unit: stored, it would
      // land in 1970's windows, outside every query's range and every retention.
      if (time_ms < kEarliestSampleMs) {
        return absl::InvalidArgumentError(absl::StrCat(
            sample_field, ": its time, ", time_ms, " ms since 1970, is before 2000 (a clock not "
            "set, or nanoseconds given in another unit?)"));
      }
      const int64_t window_start_ms = commit::WindowStart(time_ms);
      uint64_t& raw = raw_[RawKey{context, window_start_ms, stack->stack, period_ns}];
      if (raw > std::numeric_limits<uint64_t>::max() - static_cast<uint64_t>(value)) {
        return absl::InvalidArgumentError(absl::StrCat(sample_field, ": values overflow"));
      }
      raw += static_cast<uint64_t>(value);
      // Leaf lines of CPU samples, as agents send their leaf addresses.
      if (stack->leaf_line != 0 && *profile_type == v1::PROFILE_CPU) {
        base::SaturatingAddTo(
            leaf_line_raw_[LeafLineKey{context, window_start_ms,
                                       out_.stacks[stack->stack].functions.back(),
                                       stack->leaf_line, period_ns}],
            static_cast<uint64_t>(value));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Converter::AddResource(const ResourceProfiles& resource, int index) {
  const std::string field = absl::StrCat("resource_profiles ", index);
  Attributes attributes;
  if (absl::Status s = AddKeyValues(resource.resource().attributes(), field, &attributes);
      !s.ok()) {
    return s;
  }
  for (int i = 0; i < resource.scope_profiles_size(); ++i) {
    const auto& scope = resource.scope_profiles(i);
    for (int j = 0; j < scope.profiles_size(); ++j) {
      if (absl::Status s = AddProfile(scope.profiles(j), attributes,
                                      absl::StrCat(field, " scope ", i, " profile ", j));
          !s.ok()) {
        return s;
      }
      ++out_.profiles;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ConvertedRequest> Converter::Finish() {
  struct CellKey {
    uint32_t context;
    int64_t window_start_ms;
    uint32_t stack;
    bool operator<(const CellKey& o) const {
      return std::tie(context, window_start_ms, stack) <
             std::tie(o.context, o.window_start_ms, o.stack);
    }
  };
  // Nanoseconds to sampling periods, rounded to the nearest.
  auto periods = [](uint64_t raw, int64_t period_ns) {
    if (period_ns == 0) return raw;
    const uint64_t period = static_cast<uint64_t>(period_ns);
    return raw / period + (raw % period >= (period + 1) / 2);
  };
  std::map<CellKey, uint64_t> counts;  // ordered: cells come out in a stable order
  for (const auto& [key, raw] : raw_) {
    const uint64_t count = periods(raw, key.period_ns);
    if (count == 0) continue;
    uint64_t& c = counts[{key.context, key.window_start_ms, key.stack}];
    c = c > std::numeric_limits<uint64_t>::max() - count ? std::numeric_limits<uint64_t>::max()
                                                         : c + count;
  }
  if (counts.size() > limits_.max_batch_contexts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request has more than ", limits_.max_batch_contexts, " distinct samples"));
  }
  for (const auto& [key, count] : counts) {
    if (count > limits_.max_context_count) {
      return absl::InvalidArgumentError(absl::StrCat("a sample count of ", count,
                                                     " exceeds the limit of ",
                                                     limits_.max_context_count));
    }
    const Context& context = contexts_[key.context];
    out_.cells.push_back({context.service, context.host, context.labels, key.window_start_ms,
                          key.stack, count});
    out_.samples += count;
  }
  std::map<std::tuple<uint32_t, int64_t, uint32_t, uint32_t>, uint64_t> leaf_lines;
  for (const auto& [key, raw] : leaf_line_raw_) {
    const uint64_t count = periods(raw, key.period_ns);
    if (count == 0) continue;
    base::SaturatingAddTo(leaf_lines[{key.context, key.window_start_ms, key.function, key.line}],
                          count);
  }
  for (const auto& [key, count] : leaf_lines) {
    const auto& [context, window_start_ms, function, line] = key;
    const Context& c = contexts_[context];
    out_.leaf_lines.push_back({c.service, c.host, window_start_ms, function, line, count});
  }
  return std::move(out_);
}

}  // namespace

absl::StatusOr<v1::ProfileType> ProfileTypeOf(absl::string_view type, absl::string_view unit) {
  if ((type == "samples" || type == "cpu") && (unit == "count" || unit == "nanoseconds")) {
    return v1::PROFILE_CPU;
  }
  if ((type == "off_cpu" || type == "offcpu" || type == "off-cpu" || type == "events") &&
      unit == "nanoseconds") {
    return v1::PROFILE_OFF_CPU;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "sample type (", type, ", ", unit,
      ") is not stored: Strata keeps CPU profiles (samples|cpu, count|nanoseconds) and off-CPU "
      "profiles (off_cpu|offcpu|events, nanoseconds)"));
}

absl::StatusOr<ConvertedRequest> ConvertRequest(const otlp_v1::ExportProfilesServiceRequest& request,
                                                const ingest::IngestLimits& limits,
                                                const std::string& forced_host, int64_t now_ms) {
  Converter converter(request.dictionary(), limits, forced_host, now_ms);
  for (int i = 0; i < request.resource_profiles_size(); ++i) {
    if (absl::Status s = converter.AddResource(request.resource_profiles(i), i); !s.ok()) return s;
  }
  return converter.Finish();
}

}  // namespace strata::server::otlp
