// Host side of the cross-build check: serves Hello on 127.0.0.1, writes the chosen port to a
// file, and exits after answering `--max_calls` calls or after `--timeout_s` seconds.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "tests/mips64/grpc_hello/hello.grpc.pb.h"

namespace {

class HelloService final : public strata::crosscheck::Hello::Service {
 public:
  grpc::Status SayHello(grpc::ServerContext*, const strata::crosscheck::HelloRequest* req,
                        strata::crosscheck::HelloReply* reply) override {
    reply->set_message("hello " + req->name() + " (" + req->arch() + ")");
    calls.fetch_add(1);
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
};

}  // namespace

int main(int argc, char** argv) {
  std::string port_file;
  int max_calls = 1;
  int timeout_s = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--port_file")) port_file = argv[i + 1];
    if (!std::strcmp(argv[i], "--max_calls")) max_calls = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--timeout_s")) timeout_s = std::atoi(argv[i + 1]);
  }
  HelloService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "cannot listen\n");
    return 1;
  }
  if (!port_file.empty()) {
    std::ofstream(port_file + ".tmp") << port << "\n";
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  }
  std::printf("listening on 127.0.0.1:%d\n", port);
  std::fflush(stdout);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (service.calls.load() < max_calls && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  server->Shutdown();
  return service.calls.load() >= max_calls ? 0 : 1;
}
