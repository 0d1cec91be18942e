// The gRPC DebugInfo service (proto/strata/v1/debuginfo.proto): uploads of debug files into
// the DebugInfoStore, and listings. An upload that completes invalidates the Symbolizer's
// view of its build ID, so the next query names the module's frames, old ones included. In a
// cluster, a stored upload is copied on to the other nodes (Options::copy_elsewhere).
//
// Borrows the store and the symbolizer, which must outlive it. Thread-safe.
#ifndef STRATA_SERVER_SYMBOLIZE_DEBUGINFO_SERVICE_H_
#define STRATA_SERVER_SYMBOLIZE_DEBUGINFO_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "server/auth/grpc_auth.h"
#include "server/symbolize/debuginfo_store.h"
#include "server/symbolize/symbolizer.h"
#include "strata/v1/debuginfo.grpc.pb.h"

namespace strata::server::symbolize {

class DebugInfoService final : public v1::DebugInfo::Service {
 public:
  // `authorizer` (optional; null allows every call): Upload needs role operator, List reader.
  // In a cluster: copies the stored file at `path` (its name as uploaded, its build ID) to
  // the other live nodes, returning those it could not reach. It copies an upload that is
  // itself such a copy no further.
  using CopyElsewhere = std::function<std::vector<std::string>(
      grpc::ServerContext* context, const std::string& path, const std::string& file_name,
      const std::string& build_id)>;

  DebugInfoService(DebugInfoStore* store, Symbolizer* symbolizer,
                   auth::Authorizer* authorizer = nullptr, CopyElsewhere copy_elsewhere = {})
      : store_(store), symbolizer_(symbolizer), authorizer_(authorizer),
        copy_elsewhere_(std::move(copy_elsewhere)) {}

  grpc::Status Upload(grpc::ServerContext* context, grpc::ServerReader<v1::DebugInfoChunk>* reader,
                      v1::UploadDebugInfoResponse* response) override;
  grpc::Status List(grpc::ServerContext* context, const v1::ListDebugInfoRequest* request,
                    v1::ListDebugInfoResponse* response) override;

  uint64_t uploads() const { return uploads_.load(std::memory_order_relaxed); }
  uint64_t refused_uploads() const { return refused_.load(std::memory_order_relaxed); }

 private:
  DebugInfoStore* store_;
  Symbolizer* symbolizer_;
  auth::Authorizer* authorizer_;
  const CopyElsewhere copy_elsewhere_;
  std::atomic<uint64_t> uploads_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace strata::server::symbolize

#endif  // STRATA_SERVER_SYMBOLIZE_DEBUGINFO_SERVICE_H_
