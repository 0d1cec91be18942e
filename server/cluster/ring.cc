#include "server/cluster/ring.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/store/codec.h"

namespace strata::server::cluster {
namespace {

// Seeds fixed forever: changing either moves every key of every cluster.
constexpr uint64_t kKeySeed = 0x5374726174614b31ull;    // "StrataK1"
constexpr uint64_t kTokenSeed = 0x5374726174615431ull;  // "StrataT1"

}  // namespace

uint64_t RingHash(std::string_view key) { return store::Hash64(key, kKeySeed); }

std::string NodeName(const RingMember& member) {
  return absl::StrCat(member.id, " (", member.address, ")");
}

Ring::Ring(std::vector<RingMember> members) {
  std::stable_sort(members.begin(), members.end(),
                   [](const RingMember& a, const RingMember& b) { return a.id < b.id; });
  for (RingMember& m : members) {
    if (!members_.empty() && members_.back().id == m.id) continue;
    members_.push_back(std::move(m));
  }
  for (uint32_t i = 0; i < members_.size(); ++i) {
    for (uint32_t t = 0; t < members_[i].tokens; ++t) {
      tokens_.push_back({store::Hash64(absl::StrCat(members_[i].id, "#", t), kTokenSeed), i});
    }
  }
  // Equal positions (astronomically rare) are ordered by member so every node agrees.
  std::sort(tokens_.begin(), tokens_.end(), [this](const Token& a, const Token& b) {
    return a.position != b.position ? a.position < b.position
                                    : members_[a.member].id < members_[b.member].id;
  });
}

std::vector<const RingMember*> Ring::Owners(std::string_view key,
                                            uint32_t replication_factor) const {
  std::vector<const RingMember*> owners;
  if (tokens_.empty() || replication_factor == 0) return owners;
  const size_t wanted = std::min<size_t>(replication_factor, members_.size());
  const uint64_t h = RingHash(key);
  size_t i = std::lower_bound(tokens_.begin(), tokens_.end(), h,
                              [](const Token& t, uint64_t v) { return t.position < v; }) -
             tokens_.begin();
  for (size_t n = 0; n < tokens_.size() && owners.size() < wanted; ++n, ++i) {
    const RingMember* m = &members_[tokens_[i % tokens_.size()].member];
    if (std::find(owners.begin(), owners.end(), m) == owners.end()) owners.push_back(m);
  }
  return owners;
}

bool Ring::IsOwner(std::string_view key, uint32_t replication_factor,
                   std::string_view id) const {
  for (const RingMember* m : Owners(key, replication_factor)) {
    if (m->id == id) return true;
  }
  return false;
}

double Ring::Ownership(std::string_view id) const {
  if (tokens_.empty()) return 0;
  // Token i owns the arc (position[i-1], position[i]]; the first token also owns the wrap.
  long double owned = 0;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (members_[tokens_[i].member].id != id) continue;
    const uint64_t prev = tokens_[(i + tokens_.size() - 1) % tokens_.size()].position;
    const uint64_t arc = tokens_.size() == 1 ? UINT64_MAX : tokens_[i].position - prev;
    owned += static_cast<long double>(arc);
  }
  return static_cast<double>(owned / static_cast<long double>(UINT64_MAX));
}

const RingMember* Ring::Find(std::string_view id) const {
  auto it = std::lower_bound(members_.begin(), members_.end(), id,
                             [](const RingMember& m, std::string_view v) { return m.id < v; });
  return it != members_.end() && it->id == id ? &*it : nullptr;
}

}  // namespace strata::server::cluster
