#include "server/registry/agent_registry.h"

#include <vector>

#include "gtest/gtest.h"

namespace strata::server::registry {
namespace {

std::vector<uint32_t> Pids(const AgentRegistry& registry) {
  std::vector<uint32_t> pids;
  for (const AgentStatus& agent : registry.List()) {
    for (const TargetRef& t : agent.targets) pids.push_back(t.pid);
  }
  return pids;
}

v1::Target Target(uint32_t pid) {
  v1::Target t;
  t.set_id(pid);
  t.set_pid(pid);
  t.set_service("api");
  return t;
}

// A batch names exited targets whose last samples it carries; once the agent lists its
// targets in heartbeats, only those lists say what it profiles, down to none at all.
TEST(AgentRegistryTest, HeartbeatsAloneListTargetsOnceTheyHaveListedThem) {
  AgentRegistry registry;
  ASSERT_TRUE(registry
                  .Attach({"a", "host-a", "x86_64", "1.0", ""}, 99,
                          [](const v1::ServerMessage&) { return true; })
                  .ok());
  v1::SampleBatch batch;
  *batch.add_targets() = Target(1);
  *batch.add_targets() = Target(2);
  registry.RecordBatch("a", batch);  // an agent that never lists them: batches do
  EXPECT_EQ(Pids(registry), (std::vector<uint32_t>{1, 2}));

  v1::Heartbeat heartbeat;
  *heartbeat.add_targets() = Target(2);
  registry.SetTargets("a", heartbeat.targets());
  EXPECT_EQ(Pids(registry), (std::vector<uint32_t>{2}));
  registry.RecordBatch("a", batch);  // still names pid 1, which exited
  EXPECT_EQ(Pids(registry), (std::vector<uint32_t>{2}));

  registry.SetTargets("a", v1::Heartbeat().targets());
  EXPECT_TRUE(Pids(registry).empty());
  EXPECT_EQ(registry.List().at(0).batches, 2u);
}

// Two agents given one ID: the second to connect from another host is told of the first (the
// server warns), and the same host reconnecting (its old stream not yet seen to end) is not.
TEST(AgentRegistryTest, AnAgentIdConnectedFromTwoHostsNamesTheOther) {
  AgentRegistry registry;
  auto sender = [](const v1::ServerMessage&) { return true; };
  std::string other;
  ASSERT_TRUE(registry.Attach({"a", "host-a", "x86_64", "1.0", ""}, 99, sender, &other).ok());
  EXPECT_EQ(other, "");
  ASSERT_TRUE(registry.Attach({"a", "host-a", "x86_64", "1.0", ""}, 99, sender, &other).ok());
  EXPECT_EQ(other, "");
  ASSERT_TRUE(registry.Attach({"a", "host-b", "x86_64", "1.0", ""}, 99, sender, &other).ok());
  EXPECT_EQ(other, "host-a");
  ASSERT_EQ(registry.List().size(), 1u);
  EXPECT_EQ(registry.List()[0].host, "host-b");
}

}  // namespace
}  // namespace strata::server::registry
