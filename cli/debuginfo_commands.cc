// `strata debuginfo upload FILE...` and `strata debuginfo ls`: debug files on the server, by
// build ID, that name the frames of stripped modules (proto/strata/v1/debuginfo.proto).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/format.h"
#include "common/elf/elf_file.h"
#include "strata/v1/debuginfo.grpc.pb.h"

namespace strata::cli {
namespace {

constexpr size_t kChunkBytes = 1 << 20;

// Uploads one file; prints what the server stored, or the reason it refused. Returns whether
// it was stored.
bool UploadOne(Client& client, v1::DebugInfo::Stub* stub, const std::string& path) {
  // The build ID is read here too, so the server checks it arrived as sent.
  auto elf = elf::ElfFile::Open(path);
  if (!elf.ok()) {
    std::fprintf(stderr, "strata: %s: not a usable ELF64 file: %s\n", path.c_str(),
                 std::string(elf.status().message()).c_str());
    return false;
  }
  const std::string build_id = (*elf)->BuildIdHex();
  if (build_id.empty()) {
    std::fprintf(stderr, "strata: %s has no GNU build ID: frames cannot be matched to it\n",
                 path.c_str());
    return false;
  }
  elf->reset();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "strata: cannot read %s\n", path.c_str());
    return false;
  }
  grpc::ClientContext context;
  client.Authorize(&context);
  // Large files take a while on slow links: a deadline of its own, not --timeout.
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(30));
  v1::UploadDebugInfoResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::DebugInfoChunk>> writer =
      stub->Upload(&context, &response);
  v1::DebugInfoChunk chunk;
  chunk.set_file_name(path);
  chunk.set_expected_build_id(build_id);
  std::string buffer(kChunkBytes, '\0');
  bool first = true;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const std::streamsize n = in.gcount();
    if (n <= 0 && !first) break;
    chunk.set_data(buffer.data(), static_cast<size_t>(n));
    if (!writer->Write(chunk)) break;  // the server ended the call: Finish says why
    chunk.Clear();
    first = false;
  }
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) client.Check(status);
    std::fprintf(stderr, "strata: upload of %s refused: %s\n", path.c_str(),
                 status.error_message().c_str());
    return false;
  }
  const v1::DebugInfoFile& f = response.file();
  std::printf("%s %s: %s bytes, %s functions%s%s\n", f.build_id().c_str(), path.c_str(),
              WithThousands(f.size_bytes()).c_str(), WithThousands(f.functions()).c_str(),
              f.has_dwarf() ? ", DWARF" : "", response.replaced() ? " (replaced)" : "");
  // In a cluster: nodes without the file name fewer frames of their hosts until it is
  // uploaded again.
  for (const std::string& n : response.unreachable_nodes()) {
    std::fprintf(stderr, "warning: %s not copied to node %s\n", path.c_str(), n.c_str());
  }
  return true;
}

int RunUpload(CliContext* ctx, const std::vector<std::string>& files) {
  Client& client = ctx->client();
  std::unique_ptr<v1::DebugInfo::Stub> stub = v1::DebugInfo::NewStub(client.channel());
  int failed = 0;
  for (const std::string& path : files) failed += UploadOne(client, stub.get(), path) ? 0 : 1;
  return failed == 0 ? 0 : 1;
}

int RunList(CliContext* ctx) {
  Client& client = ctx->client();
  std::unique_ptr<v1::DebugInfo::Stub> stub = v1::DebugInfo::NewStub(client.channel());
  auto r = client.Call(stub.get(), &v1::DebugInfo::Stub::List, v1::ListDebugInfoRequest());
  if (ctx->options().json) return PrintJson(r), 0;
  std::printf("Uploaded debug files: %d\n", r.uploaded_size());
  Table uploaded({"BUILD ID", "SIZE", "FUNCTIONS", "DWARF", "UPLOADED", "FILE"}, {1, 2});
  for (const auto& f : r.uploaded()) {
    uploaded.AddRow({f.build_id(), WithThousands(f.size_bytes()), WithThousands(f.functions()),
                     f.has_dwarf() ? "yes" : "no", FormatRfc3339(f.uploaded_ms()),
                     f.file_name()});
  }
  if (r.uploaded_size() > 0) std::fputs(uploaded.ToString().c_str(), stdout);
  std::printf("\nIn use by queries: %d\n", r.loaded_size());
  Table loaded({"BUILD ID", "FUNCTIONS", "DWARF", "SOURCE", "FILE"}, {1});
  for (const auto& f : r.loaded()) {
    loaded.AddRow({f.build_id(), WithThousands(f.functions()), f.has_dwarf() ? "yes" : "no",
                   f.source(), f.file_name()});
  }
  if (r.loaded_size() > 0) std::fputs(loaded.ToString().c_str(), stdout);
  std::printf("\nLooked for and not found (frames stay unnamed): %d\n",
              r.missing_build_ids_size());
  for (const auto& id : r.missing_build_ids()) std::printf("  %s\n", id.c_str());
  return 0;
}

}  // namespace

void AddDebugInfoCommands(CLI::App* app, CliContext* ctx, int* exit_code) {
  auto* group = app->add_subcommand(
      "debuginfo", "debug files on the server, by build ID: they name stripped modules' frames");
  group->require_subcommand(1);
  static std::vector<std::string> files;
  auto* upload = group->add_subcommand(
      "upload", "upload unstripped binaries or separate debug files (stored by build ID; "
                "frames already stored are named by the next query)");
  upload->add_option("FILE", files, "ELF files with a build ID")->required()->check(
      CLI::ExistingFile);
  upload->callback([=] { *exit_code = RunUpload(ctx, files); });
  auto* ls = group->add_subcommand("ls", "uploaded debug files, those in use, and build IDs "
                                         "the server looked for in vain");
  ls->callback([=] { *exit_code = RunList(ctx); });
}

}  // namespace strata::cli
