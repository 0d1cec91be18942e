#include "server/otlp/otlp_builder.h"

#include "absl/strings/str_cat.h"

namespace strata::server::otlp {
namespace {

// The index of `key`'s entry, added by `add` (which appends to the table) when new.
template <typename Add>
int32_t Intern(absl::flat_hash_map<std::string, int32_t>* index, std::string key, Add add) {
  auto it = index->find(key);
  if (it != index->end()) return it->second;
  const int32_t id = add();
  index->emplace(std::move(key), id);
  return id;
}

std::string IndexKey(const std::vector<int32_t>& indices) {
  return std::string(reinterpret_cast<const char*>(indices.data()),
                     indices.size() * sizeof(int32_t));
}

}  // namespace

RequestBuilder::RequestBuilder() {
  auto* d = request_.mutable_dictionary();
  // Index 0 of every table is its zero value.
  d->add_mapping_table();
  d->add_location_table();
  d->add_function_table();
  d->add_link_table();
  d->add_string_table();
  d->add_attribute_table();
  d->add_stack_table();
  strings_.emplace("", 0);
}

int32_t RequestBuilder::String(absl::string_view s) {
  auto* d = request_.mutable_dictionary();
  return Intern(&strings_, std::string(s), [&] {
    d->add_string_table(std::string(s));
    return d->string_table_size() - 1;
  });
}

int32_t RequestBuilder::Attribute(absl::string_view key, absl::string_view value) {
  const int32_t k = String(key);
  auto* d = request_.mutable_dictionary();
  return Intern(&attributes_, absl::StrCat(key, std::string(1, '\0'), value), [&] {
    auto* a = d->add_attribute_table();
    a->set_key_strindex(k);
    a->mutable_value()->set_string_value(std::string(value));
    return d->attribute_table_size() - 1;
  });
}

std::vector<int32_t> RequestBuilder::AttributeList(const Attributes& attributes) {
  std::vector<int32_t> out;
  for (const auto& [key, value] : attributes) out.push_back(Attribute(key, value));
  return out;
}

int32_t RequestBuilder::Mapping(absl::string_view file, absl::string_view build_id, uint64_t start,
                                uint64_t limit, uint64_t file_offset) {
  const int32_t name = String(file);
  const int32_t id_attribute =
      build_id.empty() ? -1 : Attribute("process.executable.build_id.gnu", build_id);
  auto* d = request_.mutable_dictionary();
  return Intern(&mappings_,
                absl::StrCat(file, std::string(1, '\0'), build_id, "/", start, "/", limit, "/",
                             file_offset),
                [&] {
                  auto* m = d->add_mapping_table();
                  m->set_filename_strindex(name);
                  m->set_memory_start(start);
                  m->set_memory_limit(limit);
                  m->set_file_offset(file_offset);
                  if (id_attribute >= 0) m->add_attribute_indices(id_attribute);
                  return d->mapping_table_size() - 1;
                });
}

int32_t RequestBuilder::Function(absl::string_view name, absl::string_view file) {
  const int32_t n = String(name), f = String(file);
  auto* d = request_.mutable_dictionary();
  return Intern(&functions_, absl::StrCat(n, "/", f), [&] {
    auto* fn = d->add_function_table();
    fn->set_name_strindex(n);
    fn->set_filename_strindex(f);
    return d->function_table_size() - 1;
  });
}

int32_t RequestBuilder::Location(int32_t mapping, uint64_t address, const std::vector<Line>& lines,
                                 absl::string_view frame_type) {
  std::vector<int32_t> key = {mapping, static_cast<int32_t>(address >> 32),
                              static_cast<int32_t>(address)};
  std::vector<std::pair<int32_t, int64_t>> line_refs;
  for (const Line& l : lines) {
    line_refs.emplace_back(Function(l.function, l.file), l.line);
    key.push_back(line_refs.back().first);
    key.push_back(static_cast<int32_t>(l.line));
  }
  const int32_t type = frame_type.empty() ? -1 : Attribute("profile.frame.type", frame_type);
  key.push_back(type);
  auto* d = request_.mutable_dictionary();
  return Intern(&locations_, IndexKey(key), [&] {
    auto* loc = d->add_location_table();
    loc->set_mapping_index(mapping);
    loc->set_address(address);
    for (const auto& [function, line] : line_refs) {
      auto* l = loc->add_lines();
      l->set_function_index(function);
      l->set_line(line);
    }
    if (type >= 0) loc->add_attribute_indices(type);
    return d->location_table_size() - 1;
  });
}

int32_t RequestBuilder::Stack(const std::vector<int32_t>& locations) {
  auto* d = request_.mutable_dictionary();
  return Intern(&stacks_, IndexKey(locations), [&] {
    auto* s = d->add_stack_table();
    for (int32_t l : locations) s->add_location_indices(l);
    return d->stack_table_size() - 1;
  });
}

RequestBuilder::ResourceProfiles* RequestBuilder::AddResource(const Attributes& attributes) {
  auto* resource = request_.add_resource_profiles();
  for (const auto& [key, value] : attributes) {
    auto* kv = resource->mutable_resource()->add_attributes();
    kv->set_key(key);
    kv->mutable_value()->set_string_value(value);
  }
  resource->add_scope_profiles()->mutable_scope()->set_name("strata");
  return resource;
}

RequestBuilder::Profile* RequestBuilder::AddProfile(ResourceProfiles* resource,
                                                    absl::string_view type, absl::string_view unit,
                                                    uint64_t time_unix_nano,
                                                    absl::string_view period_type,
                                                    int64_t period_ns) {
  Profile* p = resource->mutable_scope_profiles(0)->add_profiles();
  p->mutable_sample_type()->set_type_strindex(String(type));
  p->mutable_sample_type()->set_unit_strindex(String(unit));
  p->set_time_unix_nano(time_unix_nano);
  if (period_ns > 0) {
    p->mutable_period_type()->set_type_strindex(String(period_type));
    p->mutable_period_type()->set_unit_strindex(String("nanoseconds"));
    p->set_period(period_ns);
  }
  return p;
}

void RequestBuilder::AddSample(Profile* profile, int32_t stack,
                               const std::vector<int32_t>& attributes, int64_t value,
                               uint64_t timestamp_unix_nano) {
  auto* s = profile->add_samples();
  s->set_stack_index(stack);
  for (int32_t a : attributes) s->add_attribute_indices(a);
  s->add_values(value);
  if (timestamp_unix_nano != 0) s->add_timestamps_unix_nano(timestamp_unix_nano);
}

}  // namespace strata::server::otlp
