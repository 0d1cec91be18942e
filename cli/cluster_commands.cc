// `strata cluster`: the ring as the asked node sees it (nodes, their state and share of the
// hash space, replication health).
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "cli/client.h"
#include "cli/format.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata::cli {
namespace {

int RunCluster(CliContext* ctx) {
  Client& client = ctx->client();
  auto stub = v1::Cluster::NewStub(client.channel());
  auto r = client.Call(stub.get(), &v1::Cluster::Stub::Status, v1::ClusterStatusRequest());
  if (ctx->options().json) return PrintJson(r), 0;
  int live = 0, down = 0;
  for (const auto& n : r.nodes()) (n.state() == "live" ? live : down) += 1;
  std::printf("Cluster seen from %s: %d live, %d down; replication factor %u; %s; etcd revision "
              "%ld\n",
              r.self_id().c_str(), live, down, r.replication_factor(),
              r.lease_held() ? "lease held" : "LEASE LOST (this node acknowledges nothing)",
              static_cast<long>(r.membership_revision()));
  Table table({"NODE", "ADDRESS", "STATE", "TOKENS", "OWNS"}, {3, 4});
  for (const auto& n : r.nodes()) {
    table.AddRow({n.id() == r.self_id() ? n.id() + " *" : n.id(), n.address(), n.state(),
                  std::to_string(n.tokens()),
                  n.state() == "live" ? absl::StrFormat("%.1f%%", 100 * n.ownership()) : "-"});
  }
  std::fputs(table.ToString().c_str(), stdout);
  const bool healthy = live >= static_cast<int>(r.replication_factor());
  std::printf("Replication: %s; %u agent streams here with other owners; %s batches forwarded\n",
              healthy ? "every host has its replicas"
                      : "UNDER-REPLICATED (fewer live nodes than the replication factor)",
              r.agents(), WithThousands(r.batches_replicated()).c_str());
  return healthy ? 0 : 3;
}

}  // namespace

void AddClusterCommands(CLI::App* app, CliContext* ctx, int* exit_code) {
  app->add_subcommand("cluster",
                      "cluster nodes, their state and token ownership, replication health "
                      "(exit 3 when under-replicated)")
      ->callback([=] { *exit_code = RunCluster(ctx); });
}

}  // namespace strata::cli
