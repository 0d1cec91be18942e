// Blocking HTTP calls to a server under test on 127.0.0.1, for the end-to-end suites. Compiled
// once into the harness: Boost.Beast's templates were a third of each test file's compile time.
#ifndef STRATA_TESTS_E2E_HTTP_CLIENT_H_
#define STRATA_TESTS_E2E_HTTP_CLIENT_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::testing {

struct HttpReply {
  int status = 0;  // 0: the connection failed or closed without a response (body: why)
  std::string content_type;
  std::string body;
};

// `method` ("GET", "POST", ...) `target` with `headers` and `body` to 127.0.0.1:`port`.
HttpReply HttpCall(int port, std::string_view method, const std::string& target,
                   const std::vector<std::pair<std::string, std::string>>& headers = {},
                   const std::string& body = "");

// GET `target` from 127.0.0.1:`port`: (status, body), or (0, error) when the connection
// failed or closed without a response.
std::pair<int, std::string> HttpGet(int port, const std::string& target);

}  // namespace strata::testing

#endif  // STRATA_TESTS_E2E_HTTP_CLIENT_H_
