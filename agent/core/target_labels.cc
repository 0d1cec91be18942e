#include "agent/core/target_labels.h"

#include "absl/strings/str_cat.h"
#include "agent/procfs/procfs.h"
#include "common/base/escape.h"
#include "common/elf/elf_file.h"

namespace strata::agent {
namespace {

std::string_view EnvValue(const TargetFacts& facts, std::string_view name) {
  for (const auto& [k, v] : facts.environment) {
    if (k == name) return v;
  }
  return {};
}

// Adds key=value when the value is valid label syntax (derived values: skipped otherwise).
void Add(labels::LabelSet* set, std::string_view key, std::string_view value,
         std::vector<std::string>* warnings) {
  if (value.empty()) return;
  if (absl::Status s = labels::ValidateLabel(key, value); !s.ok()) {
    if (warnings != nullptr) warnings->push_back(std::string(s.message()));
    return;
  }
  set->emplace_back(std::string(key), std::string(value));
}

// Name "FDO", type 0xcafe1a7e: https://systemd.io/ELF_PACKAGE_METADATA/
constexpr uint32_t kPackageNoteType = 0xcafe1a7e;

std::string VersionFromNote(const elf::ElfFile& file) {
  const elf::Section* section = file.FindSection(".note.package");
  if (section == nullptr) return "";
  absl::StatusOr<std::string_view> data = file.SectionData(*section);
  if (!data.ok() || data->size() < 12) return "";
  auto u32 = [&](size_t at) {
    const auto* p = reinterpret_cast<const unsigned char*>(data->data() + at);
    return file.big_endian() ? (uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3])
                             : (uint32_t{p[3]} << 24 | uint32_t{p[2]} << 16 | uint32_t{p[1]} << 8 | p[0]);
  };
  const uint32_t namesz = u32(0), descsz = u32(4), type = u32(8);
  const size_t desc_at = 12 + ((static_cast<size_t>(namesz) + 3) & ~size_t{3});
  if (type != kPackageNoteType || namesz > 16 || desc_at > data->size() ||
      descsz > data->size() - desc_at) {
    return "";
  }
  std::string_view desc = data->substr(desc_at, descsz);
  if (const size_t nul = desc.find('\0'); nul != std::string_view::npos) desc = desc.substr(0, nul);
  return PackageNoteVersion(desc);
}

}  // namespace

std::string PackageNoteVersion(std::string_view json) {
  // A flat JSON object of strings: find "version" as a key, then its string value.
  constexpr std::string_view kKey = "\"version\"";
  for (size_t at = json.find(kKey); at != std::string_view::npos; at = json.find(kKey, at + 1)) {
    size_t p = at + kKey.size();
    while (p < json.size() && (json[p] == ' ' || json[p] == '\t' || json[p] == '\n')) ++p;
    if (p >= json.size() || json[p] != ':') continue;
    ++p;
    while (p < json.size() && (json[p] == ' ' || json[p] == '\t' || json[p] == '\n')) ++p;
    if (p >= json.size() || json[p] != '"') continue;
    const size_t end = json.find('"', p + 1);
    if (end == std::string_view::npos) return "";
    std::string value(json.substr(p + 1, end - p - 1));
    if (value.find('\\') != std::string::npos) return "";  // escapes: not worth decoding
    return value;
  }
  return "";
}

labels::LabelSet LabelsFromFacts(const TargetFacts& facts, std::vector<std::string>* warnings) {
  labels::LabelSet derived;
  Add(&derived, kBuildIdLabel, facts.build_id_hex, warnings);
  Add(&derived, kVersionLabel, facts.package_version, warnings);
  Add(&derived, kContainerIdLabel, facts.container.container_id, warnings);
  Add(&derived, kContainerRuntimeLabel, facts.container.runtime, warnings);
  std::string_view pod_uid = facts.container.pod_uid;
  if (pod_uid.empty()) pod_uid = EnvValue(facts, "POD_UID");
  Add(&derived, kPodUidLabel, pod_uid, warnings);
  std::string_view pod = EnvValue(facts, "POD_NAME");
  // In a pod the hostname is the pod's name unless the pod spec sets another.
  if (pod.empty() && !pod_uid.empty() && !EnvValue(facts, "KUBERNETES_SERVICE_HOST").empty()) {
    pod = EnvValue(facts, "HOSTNAME");
  }
  Add(&derived, kPodLabel, pod, warnings);
  std::string_view ns = EnvValue(facts, "POD_NAMESPACE");
  if (ns.empty() && !pod_uid.empty()) ns = facts.service_account_namespace;
  Add(&derived, kNamespaceLabel, ns, warnings);
  labels::Normalize(&derived);

  labels::LabelSet own;
  if (std::string_view text = EnvValue(facts, "STRATA_LABELS"); !text.empty()) {
    absl::StatusOr<labels::LabelSet> parsed = labels::ParseLabelList(text);
    if (parsed.ok()) {
      own = *std::move(parsed);
    } else if (warnings != nullptr) {
      warnings->push_back(absl::StrCat("STRATA_LABELS='", base::EscapeForLog(text, 120),
                                       "' left out: ", parsed.status().message()));
    }
  }
  return labels::Merge(derived, own);
}

labels::LabelSet TargetLabels(const procfs::TrackedProcess& process,
                              std::vector<std::string>* warnings) {
  TargetFacts facts;
  facts.environment = process.environment;
  const std::string proc = absl::StrCat("/proc/", process.pid);
  if (auto elf = elf::ElfFile::Open(proc + "/exe"); elf.ok()) {
    facts.build_id_hex = (*elf)->BuildIdHex();
    facts.package_version = VersionFromNote(**elf);
  }
  if (auto cgroup = procfs::ReadCgroup(process.pid); cgroup.ok()) {
    facts.container = procfs::ParseCgroup(*cgroup);
  }
  if (!facts.container.pod_uid.empty()) {
    // The pod's own view of its namespace, through its root (same mount namespace or not).
    if (auto ns = procfs::ReadProcFile(
            proc + "/root/var/run/secrets/kubernetes.io/serviceaccount/namespace", 256);
        ns.ok()) {
      while (!ns->empty() && (ns->back() == '\n' || ns->back() == ' ')) ns->pop_back();
      facts.service_account_namespace = *std::move(ns);
    }
  }
  return LabelsFromFacts(facts, warnings);
}

}  // namespace strata::agent
