// OTLP profiles end to end: a client built on the OTLP protos sends what the OpenTelemetry
// eBPF profiler sends (several hosts, Go and Python frames, kernel frames, an inlined
// function, resource and sample attributes, CPU and off-CPU profiles) to the real
// strata-server on loopback; the strata CLI shows exactly those stacks and counts (top,
// hot-paths, labels, hosts, pprof export read by go tool pprof when installed). Refused
// requests (bad indexes, an unknown sample type, an oversized message, a token without the
// agent role) get their gRPC errors and store nothing; a retried request is stored once; a
// profile exported as OTLP (strata export --format otlp) and sent back under another service
// name compares equal: same stacks, kinds and counts, per host and per profile type.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "opentelemetry/proto/collector/profiles/v1development/profiles_service.grpc.pb.h"
#include "server/otlp/otlp_builder.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using server::otlp::RequestBuilder;
namespace otlp_v1 = ::opentelemetry::proto::collector::profiles::v1development;

constexpr int64_t kPeriodNs = 1'000'000'000 / 20;  // the eBPF profiler's default 20 Hz

// What one host's OTel eBPF profiler exports in one interval: service "checkout" (Go, with
// kernel frames under a syscall and an inlined function) with `write` samples of its write
// path and `hash` of its hashing path, one sample per event with its timestamp; on hosts that
// run it, service "pyworker" (CPython frames over the interpreter's native frame) with
// `python` samples; and `off_cpu_ns` of off-CPU time in checkout's write path.
RequestBuilder::Request ProfilerExport(const std::string& host, int write, int hash, int python,
                                       int64_t off_cpu_ns) {
  RequestBuilder b;
  const uint64_t now_ns = static_cast<uint64_t>(base::NowMs() - 5'000) * 1'000'000;
  const int32_t exe = b.Mapping("/usr/local/bin/checkout", "5a1d", 0x400000, 0x1000000, 0);
  const int32_t vmlinux = b.Mapping("vmlinux");
  const int32_t k_write = b.Location(vmlinux, 0xffffffff811a0000, {{"ksys_write", ""}}, "kernel");
  const int32_t k_entry =
      b.Location(vmlinux, 0xffffffff81e00000, {{"entry_SYSCALL_64", ""}}, "kernel");
  const int32_t go_write = b.Location(exe, 0x4a1000, {{"syscall.write", "syscall.go", 80}}, "go");
  const int32_t go_hash =
      b.Location(exe, 0x4b2000, {{"crypto/sha256.block", "sha256block.go", 12}}, "go");
  // main.encode was inlined into main.handle: one location, innermost line first.
  const int32_t go_handle = b.Location(
      exe, 0x4c3000, {{"main.encode", "encode.go", 31}, {"main.handle", "main.go", 55}}, "go");
  const int32_t go_main = b.Location(exe, 0x4d4000, {{"main.main", "main.go", 12}}, "go");
  const int32_t go_exit =
      b.Location(exe, 0x4e5000, {{"runtime.goexit", "asm_amd64.s", 1700}}, "go");
  const int32_t write_stack = b.Stack({k_write, k_entry, go_write, go_handle, go_main, go_exit});
  const int32_t hash_stack = b.Stack({go_hash, go_handle, go_main, go_exit});
  const auto checkout_attributes = b.AttributeList({{"container.id", "ctr-" + host},
                                                    {"process.executable.name", "checkout"},
                                                    {"process.executable.path",
                                                     "/usr/local/bin/checkout"},
                                                    {"process.pid", "4242"},
                                                    {"thread.name", "checkout"}});
  auto* checkout = b.AddResource({{"service.name", "checkout"},
                                  {"host.name", host},
                                  {"k8s.namespace.name", "shop"}});
  auto* cpu = b.AddProfile(checkout, "samples", "count", now_ns, "cpu", kPeriodNs);
  for (int i = 0; i < write; ++i) {
    b.AddSample(cpu, write_stack, checkout_attributes, 1, now_ns + i * 1000);
  }
  for (int i = 0; i < hash; ++i) {
    b.AddSample(cpu, hash_stack, checkout_attributes, 1, now_ns + i * 1000);
  }
  if (off_cpu_ns > 0) {
    auto* off = b.AddProfile(checkout, "events", "nanoseconds", now_ns);
    b.AddSample(off, write_stack, checkout_attributes, off_cpu_ns, now_ns);
  }
  if (python > 0) {
    const int32_t libpython = b.Mapping("/usr/lib/libpython3.11.so.1.0", "", 0x7f0000000000,
                                        0x7f0000400000, 0);
    const int32_t eval = b.Location(libpython, 0x7f0000012345, {}, "native");
    const int32_t py_module = b.Location(libpython, 0, {{"<module>", "/app/worker.py", 1}}, "cpython");
    const int32_t py_loop = b.Location(libpython, 0, {{"loop", "/app/worker.py", 20}}, "cpython");
    const int32_t py_score = b.Location(libpython, 0, {{"score", "/app/model.py", 7}}, "cpython");
    auto* worker = b.AddResource({{"service.name", "pyworker"}, {"host.name", host}});
    auto* p = b.AddProfile(worker, "samples", "count", now_ns, "cpu", kPeriodNs);
    b.AddSample(p, b.Stack({py_score, py_loop, py_module, eval}),
                b.AttributeList({{"process.executable.name", "python3.11"}}), python, now_ns);
  }
  return b.Take();
}

class OtlpE2eTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> extra = {}) {
    server_ = std::make_unique<ServerProcess>(dir_.File("data"), dir_.File("server.log"), extra);
    ASSERT_GT(server_->port(), 0) << server_->process().Output();
    stub_ = otlp_v1::ProfilesService::NewStub(server_->Channel());
  }

  grpc::Status Export(const RequestBuilder::Request& request, const std::string& token = "",
                      grpc_compression_algorithm compression = GRPC_COMPRESS_NONE) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    context.set_compression_algorithm(compression);
    otlp_v1::ExportProfilesServiceResponse response;
    return stub_->Export(&context, request, &response);
  }

  CommandResult Cli(std::vector<std::string> args) {
    std::vector<std::string> argv{BinPath("strata"), "--server", server_->address()};
    argv.insert(argv.end(), cli_flags_.begin(), cli_flags_.end());
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(std::move(argv));
  }

  // total_samples of `strata --json top` with `args`.
  uint64_t Total(std::vector<std::string> args) {
    std::vector<std::string> argv{"--json", "top"};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = Cli(argv);
    if (r.output.find("unknown service") != std::string::npos) return 0;  // nothing stored
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::smatch m;
    if (!std::regex_search(r.output, m, std::regex(R"("total_samples":\s*"?(\d+))"))) {
      return 0;  // no samples: the JSON leaves the zero out
    }
    return std::stoull(m[1]);
  }

  // Hot paths of `service` as "frame;frame;... count" lines (kinds marked), sorted.
  std::vector<std::string> Paths(const std::string& service, v1::ProfileType type = v1::PROFILE_CPU) {
    auto stub = v1::Query::NewStub(server_->Channel());
    grpc::ClientContext ctx;
    v1::HotPathsRequest request;
    request.mutable_filter()->set_service(service);
    request.mutable_filter()->set_type(type);
    request.set_limit(1000);
    v1::HotPathsResponse response;
    grpc::Status s = stub->HotPaths(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<std::string> out;
    for (const v1::HotPath& p : response.paths()) {
      std::string line;
      for (const v1::Frame& f : p.frames()) {
        const char* kinds[] = {"", "[k]", "[j]", "[p]"};
        absl::StrAppend(&line, line.empty() ? "" : ";", f.function(), kinds[f.kind()]);
      }
      out.push_back(absl::StrCat(line, " ", p.samples()));
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  void ExportAndResend(const std::string& service, const std::string& type,
                       const std::string& copy);

  strata::testing::TempDir dir_{"otlp_e2e"};
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<otlp_v1::ProfilesService::Stub> stub_;
  std::vector<std::string> cli_flags_;
};

const char kWritePath[] =
    "runtime.goexit;main.main;main.handle;main.encode;syscall.write;entry_SYSCALL_64[k];"
    "ksys_write[k]";
const char kHashPath[] = "runtime.goexit;main.main;main.handle;main.encode;crypto/sha256.block";

TEST_F(OtlpE2eTest, ProfilerExportsShowExactly) {
  Start({"--max-message-bytes", "1048576"});
  ASSERT_TRUE(Export(ProfilerExport("node-1", 30, 12, 15, 1'000'000'000)).ok());
  ASSERT_TRUE(Export(ProfilerExport("node-2", 20, 8, 0, 0)).ok());

  // Stacks, frame kinds and counts, as sent: kernel frames under the Go syscall, the inlined
  // function as a frame of its own, Python frames over the interpreter's native frame.
  EXPECT_THAT(Paths("checkout"), ElementsAre(absl::StrCat(kHashPath, " 20"),
                                             absl::StrCat(kWritePath, " 50")));
  EXPECT_THAT(Paths("checkout", v1::PROFILE_OFF_CPU),
              ElementsAre(absl::StrCat(kWritePath, " 99")));  // 1 s at 99 Hz
  EXPECT_THAT(Paths("pyworker"),
              ElementsAre("libpython3.11.so.1.0+0x12345;<module>[p];loop[p];score[p] 15"));

  // Python lines, as the sender gave them: where the samples were, and the call sites.
  CommandResult lines = Cli({"top", "-s", "pyworker", "--by", "line"});
  ASSERT_EQ(lines.exit_code, 0) << lines.output;
  EXPECT_TRUE(std::regex_search(lines.output, std::regex(R"(\b15\b[^\n]*model\.py:7)")))
      << lines.output;
  CommandResult flame = Cli({"flamegraph", "-s", "pyworker", "--lines", "--format", "folded"});
  ASSERT_EQ(flame.exit_code, 0) << flame.output;
  EXPECT_THAT(flame.output, HasSubstr("worker.py:20"));

  // The CLI: top, hot-paths, hosts, labels, profile types.
  EXPECT_EQ(Total({"-s", "checkout"}), 70u);
  EXPECT_EQ(Total({"-s", "checkout", "--host", "node-2"}), 28u);
  EXPECT_EQ(Total({"-s", "checkout", "--select", "container.id=ctr-node-1"}), 42u);
  EXPECT_EQ(Total({"-s", "checkout", "--select", "k8s.namespace.name=shop"}), 70u);
  EXPECT_EQ(Total({"-s", "checkout", "--type", "off-cpu"}), 99u);
  CommandResult top = Cli({"top", "-s", "checkout"});
  ASSERT_EQ(top.exit_code, 0) << top.output;
  EXPECT_THAT(top.output, HasSubstr("ksys_write"));
  EXPECT_THAT(top.output, HasSubstr("crypto/sha256.block"));
  EXPECT_TRUE(std::regex_search(top.output, std::regex(R"(\b50\b[^\n]*ksys_write)")))
      << top.output;
  CommandResult paths = Cli({"hot-paths", "-s", "checkout"});
  ASSERT_EQ(paths.exit_code, 0) << paths.output;
  EXPECT_THAT(paths.output, HasSubstr("entry_SYSCALL_64"));
  CommandResult labels = Cli({"labels", "-s", "checkout"});
  ASSERT_EQ(labels.exit_code, 0) << labels.output;
  for (const char* text : {"container.id", "ctr-node-2", "process.executable.path",
                           "k8s.namespace.name"}) {
    EXPECT_THAT(labels.output, HasSubstr(text));
  }
  EXPECT_EQ(labels.output.find("process.pid"), std::string::npos) << labels.output;
  EXPECT_EQ(labels.output.find("thread.name"), std::string::npos) << labels.output;

  // A retried request (its answer lost) is stored once.
  ASSERT_TRUE(Export(ProfilerExport("node-2", 20, 8, 0, 0)).ok());
  // ProfilerExport's timestamps differ by the call's time: resend the very same request.
  const auto again = ProfilerExport("node-3", 5, 0, 0, 0);
  ASSERT_TRUE(Export(again).ok());
  ASSERT_TRUE(Export(again).ok());
  EXPECT_EQ(Total({"-s", "checkout", "--host", "node-3"}), 5u);
  EXPECT_EQ(Total({"-s", "checkout"}), 103u);  // 70 + 28 (a new export) + 5

  // Refused requests: a clear error each, nothing of them stored.
  auto bad_index = ProfilerExport("node-9", 3, 3, 0, 0);
  bad_index.mutable_dictionary()->mutable_stack_table(2)->set_location_indices(0, 4000);
  grpc::Status s = Export(bad_index);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("location index 4000 outside the location table"));
  auto heap = ProfilerExport("node-9", 3, 3, 0, 0);
  heap.mutable_dictionary()->add_string_table("alloc_space");
  heap.mutable_resource_profiles(0)->mutable_scope_profiles(0)->mutable_profiles(0)
      ->mutable_sample_type()->set_type_strindex(heap.dictionary().string_table_size() - 1);
  s = Export(heap);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("sample type (alloc_space, count) is not stored"));
  auto oversized = ProfilerExport("node-9", 3, 3, 0, 0);
  oversized.mutable_dictionary()->add_string_table(std::string(2 << 20, 'x'));
  s = Export(oversized);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(Total({"-s", "checkout", "--host", "node-9"}), 0u);
  EXPECT_EQ(Total({"-s", "checkout"}), 103u);

  // pprof export of what came in as OTLP.
  const std::string pprof_file = dir_.File("checkout.pb.gz");
  CommandResult exported = Cli({"export", "-s", "checkout", "--host", "node-1", "-o", pprof_file});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_THAT(exported.output, HasSubstr("42 samples"));
  if (RunCommand({"/bin/sh", "-c", "command -v go"}).exit_code == 0) {
    CommandResult pprof = RunCommand(
        {"/usr/bin/env", "HOME=" + dir_.path(), "GOCACHE=" + dir_.path() + "/gocache", "go",
         "tool", "pprof", "-top", "-sample_index=samples", "-symbolize=none", pprof_file},
        120);
    ASSERT_EQ(pprof.exit_code, 0) << pprof.output;
    EXPECT_THAT(pprof.output, HasSubstr("of 42 total"));
    EXPECT_TRUE(std::regex_search(pprof.output, std::regex(R"(\n\s*30 .*ksys_write)")))
        << pprof.output;
    EXPECT_TRUE(std::regex_search(pprof.output, std::regex(R"(\n\s*12 .*crypto/sha256.block)")))
        << pprof.output;
  } else {
    std::printf("go is not installed: the pprof file is not read back\n");
  }
}

// `service`'s profile of `type` exported as OTLP by the CLI, sent back as `copy`.
void OtlpE2eTest::ExportAndResend(const std::string& service, const std::string& type,
                                  const std::string& copy) {
  const std::string file = dir_.File(service + "-" + type + ".otlp");
  CommandResult out = Cli({"export", "--format", "otlp", "-s", service, "--type", type,
                           "--since", "1h", "-o", file});
  ASSERT_EQ(out.exit_code, 0) << out.output;
  EXPECT_THAT(out.output, HasSubstr("Wrote OTLP profiles"));
  std::ifstream in(file, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  RequestBuilder::Request request;
  ASSERT_TRUE(request.ParseFromString(bytes.str()));
  ASSERT_GT(request.resource_profiles_size(), 0);
  for (auto& resource : *request.mutable_resource_profiles()) {
    for (auto& attribute : *resource.mutable_resource()->mutable_attributes()) {
      if (attribute.key() == "service.name") attribute.mutable_value()->set_string_value(copy);
    }
  }
  grpc::Status s = Export(request);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

TEST_F(OtlpE2eTest, ExportedAsOtlpAndSentBackComparesEqual) {
  Start();
  ASSERT_TRUE(Export(ProfilerExport("node-1", 30, 12, 15, 1'000'000'000)).ok());
  ASSERT_TRUE(Export(ProfilerExport("node-2", 20, 8, 0, 2'000'000'000)).ok());
  ExportAndResend("checkout", "cpu", "checkout-copy");
  ExportAndResend("checkout", "off-cpu", "checkout-copy");
  ExportAndResend("pyworker", "cpu", "pyworker-copy");
  EXPECT_EQ(Paths("checkout-copy"), Paths("checkout"));
  EXPECT_EQ(Paths("checkout-copy", v1::PROFILE_OFF_CPU), Paths("checkout", v1::PROFILE_OFF_CPU));
  EXPECT_EQ(Paths("pyworker-copy"), Paths("pyworker"));
  for (const char* host : {"node-1", "node-2"}) {
    EXPECT_EQ(Total({"-s", "checkout-copy", "--since", "2h", "--host", host}),
              Total({"-s", "checkout", "--since", "2h", "--host", host}))
        << host;
  }
  EXPECT_EQ(Total({"-s", "checkout-copy", "--since", "2h"}), 70u);
  EXPECT_EQ(Total({"-s", "checkout-copy", "--since", "2h", "--type", "off-cpu"}), 297u);
}

TEST_F(OtlpE2eTest, OnlyTheAgentRoleMayExport) {
  for (const char* name : {"fleet", "alice"}) {
    std::ofstream(dir_.File(absl::StrCat(name, ".token"))) << name << "-" << getpid() << "-secret\n";
  }
  std::string auth;
  for (const auto& [name, role] : std::map<std::string, std::string>{{"fleet", "agent"},
                                                                     {"alice", "reader"}}) {
    CommandResult line =
        RunCommand({"/bin/sh", "-c",
                    absl::StrCat(BinPath("strata-server"), " hash-token --name ", name,
                                 " --role ", role, " < ", dir_.File(name + ".token"))});
    ASSERT_EQ(line.exit_code, 0) << line.output;
    auth += line.output;
  }
  std::ofstream(dir_.File("auth")) << auth;
  Start({"--auth-file", dir_.File("auth")});
  const auto request = ProfilerExport("node-1", 4, 2, 0, 0);
  grpc::Status s = Export(request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  s = Export(request, absl::StrCat("alice-", getpid(), "-secret"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  cli_flags_ = {"--token-file", dir_.File("alice.token")};
  EXPECT_EQ(Total({"-s", "checkout"}), 0u);
  s = Export(request, absl::StrCat("fleet-", getpid(), "-secret"));
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Total({"-s", "checkout"}), 6u);
}

// A request that does not parse gets a clear error (gRPC's own handler answered INTERNAL with
// no message), and what was stored before stays.
TEST_F(OtlpE2eTest, ARequestThatDoesNotParseIsRefusedClearly) {
  Start();
  ASSERT_TRUE(Export(ProfilerExport("node-1", 4, 2, 0, 0)).ok());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  // Field 1 as 127 bytes long, and 3 bytes: no protobuf message parses from it.
  const grpc::Slice garbage(std::string("\x0a\x7f" "abc"));
  grpc::ByteBuffer request(&garbage, 1);
  grpc::ByteBuffer response;
  const std::shared_ptr<grpc::Channel> channel = server_->Channel();
  const grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(),
      grpc::internal::RpcMethod("/opentelemetry.proto.collector.profiles.v1development."
                                "ProfilesService/Export",
                                grpc::internal::RpcMethod::NORMAL_RPC, channel),
      &context, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("does not parse"), std::string::npos) << s.error_message();
  EXPECT_EQ(Total({"-s", "checkout"}), 6u);
  ASSERT_TRUE(Export(ProfilerExport("node-2", 4, 2, 0, 0)).ok());
  EXPECT_EQ(Total({"-s", "checkout"}), 12u);
}

// gRPC 1.51 inflates a compressed message whole before --max-message-bytes applies (300 KiB
// of gzip took a server 650 MB): compressed calls are refused at their headers unless
// --accept-compressed.
TEST_F(OtlpE2eTest, CompressedRequestsAreRefusedUnlessAccepted) {
  Start();
  const grpc::Status s = Export(ProfilerExport("node-1", 4, 2, 0, 0), "", GRPC_COMPRESS_GZIP);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
  EXPECT_NE(s.error_message().find("'gzip' is disabled"), std::string::npos) << s.error_message();
  ASSERT_TRUE(Export(ProfilerExport("node-1", 4, 2, 0, 0)).ok());
  EXPECT_EQ(Total({"-s", "checkout"}), 6u);

  server_.reset();
  server_ = std::make_unique<ServerProcess>(dir_.File("data"), dir_.File("accepting.log"),
                                            std::vector<std::string>{"--accept-compressed"});
  ASSERT_GT(server_->port(), 0) << server_->process().Output();
  stub_ = otlp_v1::ProfilesService::NewStub(server_->Channel());
  const grpc::Status accepted =
      Export(ProfilerExport("node-2", 4, 2, 0, 0), "", GRPC_COMPRESS_GZIP);
  ASSERT_TRUE(accepted.ok()) << accepted.error_message();
  EXPECT_EQ(Total({"-s", "checkout"}), 12u);
}

}  // namespace
}  // namespace strata::e2e
