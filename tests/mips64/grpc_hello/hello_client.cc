// Target side of the cross-build check: a statically linked mips64el gRPC client. Calls
// Hello.SayHello on 127.0.0.1:<port> and exits 0 when the reply matches.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "tests/mips64/grpc_hello/hello.grpc.pb.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <port>\n", argv[0]);
    return 2;
  }
  auto channel = grpc::CreateChannel(std::string("127.0.0.1:") + argv[1],
                                     grpc::InsecureChannelCredentials());
  auto stub = strata::crosscheck::Hello::NewStub(channel);
  strata::crosscheck::HelloRequest req;
  req.set_name("strata");
#if defined(__mips__)
  req.set_arch(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? "mips64el" : "mips64");
#else
  req.set_arch("host");
#endif
  strata::crosscheck::HelloReply reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::Status st = stub->SayHello(&ctx, req, &reply);
  if (!st.ok()) {
    std::fprintf(stderr, "rpc failed: %s\n", st.error_message().c_str());
    return 1;
  }
  std::printf("%s\n", reply.message().c_str());
  return reply.message() == "hello strata (" + req.arch() + ")" ? 0 : 1;
}
