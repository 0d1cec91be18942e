#include "server/app/maintenance.h"

#include <cstdio>
#include <iostream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/app/security.h"
#include "server/app/server_flags.h"
#include "server/auth/auth_file.h"
#include "server/cluster/etcd/etcd_client.h"
#include "server/cluster/membership.h"
#include "server/store/backup.h"
#include "server/symbolize/debuginfo_store.h"

namespace strata::server::app {
namespace {

// Uploaded debug files live beside the store, by build ID: copied as files, not versioned.
absl::StatusOr<size_t> WithDebugFiles(absl::Status store, const std::string& from,
                                      const std::string& to) {
  if (!store.ok()) return store;
  absl::StatusOr<size_t> copied =
      symbolize::CopyDebugFiles(from + "/debuginfo", to + "/debuginfo");
  if (!copied.ok()) {
    return absl::Status(copied.status().code(),
                        absl::StrCat("debug files: ", copied.status().message()));
  }
  return copied;
}

void PrintError(const char* command, const absl::Status& status) {
  std::fprintf(stderr, "strata-server %s: %s\n", command, std::string(status.message()).c_str());
}

}  // namespace

MaintenanceCommands::MaintenanceCommands(CLI::App& app, ServerOptions& options)
    : options_(options) {
  std::string& data = options.storage.data_dir;
  backup_ = app.add_subcommand(
      "backup", "copy the store in --data into a backup directory (incremental, checksummed; "
                "the server may keep running)");
  backup_->add_option("--data", data, "the server's data directory")->capture_default_str();
  backup_->add_option("--to", backup_to_, "backup directory (created if missing)")->required();
  backup_->add_option("--keep", backup_keep_, "backups to keep there (0: all)")
      ->capture_default_str();
  restore_ = app.add_subcommand(
      "restore", "restore the latest backup into a new data directory (the server stopped)");
  restore_->add_option("--from", restore_from_, "backup directory")->required();
  restore_->add_option("--data", data, "new data directory (must be empty or missing)")
      ->required();
  hash_token_ = app.add_subcommand(
      "hash-token", "read a token on standard input and print the line of it for the tokens "
                    "file (the token itself is never stored)");
  hash_token_->add_option("--name", hash_name_, "principal name")->capture_default_str();
  hash_token_->add_option("--role", hash_role_, "agent, reader, operator or node")
      ->check(CLI::IsMember({"agent", "reader", "operator", "node"}))
      ->capture_default_str();
  forget_node_ = app.add_subcommand(
      "forget-node", "remove a stopped node from a cluster for good: no node lists it as down "
                     "any more (a node that starts again with its ID joins as before)");
  forget_node_->add_option("node", forgotten_node_, "the node's --node-id")->required();
  forget_node_->add_option("--cluster-etcd", options.cluster.etcd_endpoints,
                           "the cluster's etcd endpoints")
      ->required();
  forget_node_->add_option("--cluster-prefix", options.cluster.prefix,
                           "the cluster's key prefix in etcd")
      ->capture_default_str();
  AddEtcdTlsFlags(*forget_node_, options.cluster.etcd_client);
}

std::optional<int> MaintenanceCommands::Run() {
  if (*forget_node_) return ForgetNode();
  if (*hash_token_) return HashToken();
  if (*backup_) return Backup();
  if (*restore_) return Restore();
  return std::nullopt;
}

int MaintenanceCommands::ForgetNode() {
  ClusterOptions& cluster = options_.cluster;
  absl::StatusOr<rpc::ClientSecurity> security;
  if (absl::Status resolved = ResolveEtcdTls(cluster.etcd_client, cluster.node_client);
      !resolved.ok()) {
    security = resolved;
  } else {
    security = LoadEtcdSecurity(cluster.etcd_endpoints, cluster.etcd_client);
  }
  if (!security.ok()) {
    PrintError("forget-node", security.status());
    return 2;
  }
  auto etcd = cluster::EtcdClient::Create(
      cluster.etcd_endpoints,
      {.call_timeout = absl::Seconds(10), .security = *std::move(security)});
  absl::Status forgotten =
      etcd.ok() ? cluster::Membership::Forget(**etcd, cluster.prefix, forgotten_node_)
                : etcd.status();
  if (!forgotten.ok()) {
    PrintError("forget-node", forgotten);
    return absl::IsInvalidArgument(forgotten) ? 2 : 1;
  }
  std::printf("node %s forgotten: no node lists it any more\n", forgotten_node_.c_str());
  return 0;
}

int MaintenanceCommands::HashToken() {
  std::string token;
  std::getline(std::cin, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) {
    std::fprintf(stderr, "strata-server hash-token: no token on standard input\n");
    return 2;
  }
  std::printf("token %s %s %s\n", hash_name_.c_str(), hash_role_.c_str(),
              auth::FormatTokenHash(auth::HashToken(token)).c_str());
  return 0;
}

int MaintenanceCommands::Backup() {
  const std::string& data = options_.storage.data_dir;
  store::BackupInfo info;
  absl::StatusOr<size_t> debug_files = WithDebugFiles(
      store::BackupStore(data, backup_to_, backup_keep_, &info), data, backup_to_);
  if (!debug_files.ok()) {
    PrintError("backup", debug_files.status());
    return 1;
  }
  std::printf("backup %u of %s in %s: %llu bytes; %u backups kept; %zu debug files copied\n",
              info.backup_id, data.c_str(), backup_to_.c_str(),
              static_cast<unsigned long long>(info.bytes), info.backups, *debug_files);
  return 0;
}

int MaintenanceCommands::Restore() {
  const std::string& data = options_.storage.data_dir;
  absl::StatusOr<size_t> debug_files =
      WithDebugFiles(store::RestoreStore(restore_from_, data), restore_from_, data);
  if (!debug_files.ok()) {
    PrintError("restore", debug_files.status());
    return 1;
  }
  std::printf("restored the latest backup of %s into %s (%zu debug files)\n",
              restore_from_.c_str(), data.c_str(), *debug_files);
  return 0;
}

}  // namespace strata::server::app
