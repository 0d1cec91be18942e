#include "server/symbolize/debuginfo_service.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/log.h"
#include "common/rpc/grpc_status.h"

namespace strata::server::symbolize {
namespace {

void ToProto(const DebugFileInfo& info, std::string source, v1::DebugInfoFile* out) {
  out->set_build_id(info.build_id);
  out->set_file_name(info.file_name);
  out->set_size_bytes(info.size_bytes);
  out->set_uploaded_ms(info.uploaded_ms);
  out->set_functions(info.functions);
  out->set_has_dwarf(info.has_dwarf);
  out->set_source(std::move(source));
}

}  // namespace

grpc::Status DebugInfoService::Upload(grpc::ServerContext* context,
                                      grpc::ServerReader<v1::DebugInfoChunk>* reader,
                                      v1::UploadDebugInfoResponse* response) {
  if (auto p = auth::AuthorizeCall(authorizer_, context, auth::Role::kOperator,
                                   "uploading debug info");
      !p.ok()) {
    return rpc::ToGrpcStatus(p.status());
  }
  absl::StatusOr<std::string> temporary = store_->NewTemporary();
  if (!temporary.ok()) return rpc::ToGrpcStatus(temporary.status());
  auto refuse = [&](const absl::Status& status) {
    store_->Discard(*temporary);
    refused_.fetch_add(1, std::memory_order_relaxed);
    return rpc::ToGrpcStatus(status);
  };
  std::ofstream out(*temporary, std::ios::binary | std::ios::trunc);
  v1::DebugInfoChunk chunk;
  std::string file_name, expected_build_id;
  uint64_t size = 0;
  bool first = true;
  while (reader->Read(&chunk)) {
    if (first) {
      file_name = chunk.file_name();
      expected_build_id = chunk.expected_build_id();
      if (!expected_build_id.empty() && !IsBuildIdHex(expected_build_id)) {
        return refuse(absl::InvalidArgumentError(
            absl::StrCat("expected build ID '", expected_build_id, "' is not lowercase hex")));
      }
      first = false;
    }
    size += chunk.data().size();
    if (size > store_->max_file_bytes()) {
      return refuse(absl::ResourceExhaustedError(
          absl::StrCat("debug file larger than the server's --max-debuginfo-bytes (",
                       store_->max_file_bytes(), ")")));
    }
    out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
  }
  if (context->IsCancelled()) return refuse(absl::CancelledError("upload cancelled"));
  if (!out.flush()) return refuse(absl::InternalError("cannot write the upload to disk"));
  out.close();
  if (size == 0) return refuse(absl::InvalidArgumentError("empty upload"));
  absl::StatusOr<DebugInfoStore::Stored> stored =
      store_->Commit(*temporary, file_name, expected_build_id, absl::ToUnixMillis(absl::Now()));
  if (!stored.ok()) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return rpc::ToGrpcStatus(absl::Status(
        stored.status().code(), absl::StrCat(file_name, ": ", stored.status().message())));
  }
  symbolizer_->Invalidate(stored->info.build_id);
  uploads_.fetch_add(1, std::memory_order_relaxed);
  LogInfo("debug info uploaded: {} ({}, {} bytes, {} functions{})", stored->info.build_id,
               stored->info.file_name, stored->info.size_bytes, stored->info.functions,
               stored->info.has_dwarf ? ", DWARF" : "");
  ToProto(stored->info, "upload", response->mutable_file());
  response->set_replaced(stored->replaced);
  if (copy_elsewhere_) {
    if (std::optional<std::string> path = store_->PathOf(stored->info.build_id)) {
      for (std::string& n : copy_elsewhere_(context, *path, file_name, stored->info.build_id)) {
        response->add_unreachable_nodes(std::move(n));
      }
    }
  }
  return grpc::Status::OK;
}

grpc::Status DebugInfoService::List(grpc::ServerContext* context, const v1::ListDebugInfoRequest*,
                                    v1::ListDebugInfoResponse* response) {
  if (auto p = auth::AuthorizeCall(authorizer_, context, auth::Role::kReader,
                                   "listing debug info");
      !p.ok()) {
    return rpc::ToGrpcStatus(p.status());
  }
  for (const DebugFileInfo& info : store_->List()) ToProto(info, "upload", response->add_uploaded());
  for (const LoadedDebugInfo& loaded : symbolizer_->Loaded()) {
    DebugFileInfo info;
    info.build_id = loaded.build_id;
    info.file_name = loaded.path;
    info.functions = loaded.functions;
    info.has_dwarf = loaded.has_dwarf;
    ToProto(info, loaded.source, response->add_loaded());
  }
  for (std::string& id : symbolizer_->Missing()) response->add_missing_build_ids(std::move(id));
  return grpc::Status::OK;
}

}  // namespace strata::server::symbolize
