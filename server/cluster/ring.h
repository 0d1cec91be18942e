// server/cluster: a Strata cluster's hash ring. Every node owns virtual tokens on a 64-bit
// ring, derived from its ID (so every node, given the same members, computes the same ring
// without agreeing on anything but membership). A key (an agent's host) belongs to the first
// `replication_factor` distinct nodes clockwise from its hash: its replica set, best first.
//
// Ring is an immutable value: membership (membership.h) builds a new one on every change and
// hands out shared pointers to it.
#ifndef STRATA_SERVER_CLUSTER_RING_H_
#define STRATA_SERVER_CLUSTER_RING_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::server::cluster {

struct RingMember {
  std::string id;
  std::string address;  // host:port of its gRPC listener
  uint32_t tokens = 0;

  bool operator==(const RingMember&) const = default;
};

// A member as messages name it: "n2 (10.0.0.2:7070)".
std::string NodeName(const RingMember& member);

// Tokens a node takes unless told otherwise: enough that three nodes own within a few
// percent of a third each, few enough that the ring of 1,000 nodes stays small.
inline constexpr uint32_t kDefaultTokens = 128;

// The ring's hash of a key (a stable hash: the ring must agree across nodes and releases).
uint64_t RingHash(std::string_view key);

class Ring {
 public:
  Ring() = default;
  // Members in any order (membership.h puts the nodes holding a lease in it); duplicates by
  // ID keep the first.
  explicit Ring(std::vector<RingMember> members);

  // The replica set of `key`: up to `replication_factor` distinct members clockwise from its
  // hash, best first. Empty for an empty ring.
  std::vector<const RingMember*> Owners(std::string_view key, uint32_t replication_factor) const;
  bool IsOwner(std::string_view key, uint32_t replication_factor, std::string_view id) const;

  // Share of the hash space whose first owner is `id` (0 for an unknown ID).
  double Ownership(std::string_view id) const;

  const RingMember* Find(std::string_view id) const;
  const std::vector<RingMember>& members() const { return members_; }  // sorted by ID
  bool empty() const { return members_.empty(); }

 private:
  struct Token {
    uint64_t position;
    uint32_t member;  // index into members_
  };
  std::vector<RingMember> members_;
  std::vector<Token> tokens_;  // sorted by position
};

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_RING_H_
