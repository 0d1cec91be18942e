#include "server/http/http_server.h"

#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/escape.h"
#include "spdlog/spdlog.h"

namespace strata::server::http {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string UrlDecode(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out.push_back(' ');
    } else if (in[i] == '%' && i + 2 < in.size() && HexValue(in[i + 1]) >= 0 &&
               HexValue(in[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(in[i + 1]) * 16 + HexValue(in[i + 2])));
      i += 2;
    } else {
      out.push_back(in[i]);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not of the form host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) host = "0.0.0.0";
  return std::make_pair(host, port);
}

namespace {

// Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF): query parameters
// end up in protobuf strings and JSON, which require it.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

// --- TLS ---------------------------------------------------------------------------------

// What identifies one version of a file: a rename gives a new inode, an edit in place a new
// size or mtime. A file that cannot be stat'ed has its errno instead, so that it appearing
// (or changing from one error to another) is a change too.
struct FileStamp {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0;
  int error = 0;
  bool operator==(const FileStamp&) const = default;
};

FileStamp Stamp(const std::string& path) {
  FileStamp stamp;
  if (path.empty()) return stamp;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    stamp.error = errno;
    return stamp;
  }
  stamp.dev = st.st_dev;
  stamp.ino = st.st_ino;
  stamp.size = st.st_size;
  stamp.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  return stamp;
}

using TlsStamp = std::vector<FileStamp>;  // certificate, key, client CA

TlsStamp StampAll(const HttpServerOptions::Tls& tls) {
  return {Stamp(tls.cert_file), Stamp(tls.key_file), Stamp(tls.client_ca_file)};
}

// The OpenSSL error queue is per thread: whatever a failed load left there must not be
// mistaken for the next connection's error on this I/O thread.
std::string TakeOpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

// What went wrong in an asio ssl::context call: asio takes the first OpenSSL error off the
// queue into `ec`; anything still queued adds detail.
std::string ErrorText(const beast::error_code& ec) {
  std::string text = ec.message();
  if (ERR_peek_error() != 0) absl::StrAppend(&text, " (", TakeOpenSslErrors(), ")");
  return text;
}

// Keys are never encrypted here: a server has nobody to ask for a passphrase.
int NoPassphrase(char*, int, int, void*) { return 0; }

absl::StatusOr<std::string> ReadWhole(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read TLS ", what, " '",
                                                   base::EscapeForLog(path),
                                                   "': ", std::strerror(errno)));
  }
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read TLS ", what, " '", base::EscapeForLog(path), "'"));
  }
  return data;
}

// A server context for `tls`: TLS 1.2 and 1.3 only, the certificate (chain) and its key, and
// with a client CA, client certificates requested and verified (but not required). The files
// are read whole first so that an unreadable file is named with its errno.
absl::StatusOr<std::shared_ptr<ssl::context>> BuildTlsContext(const HttpServerOptions::Tls& tls) {
  auto cert = ReadWhole("certificate", tls.cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadWhole("key", tls.key_file);
  if (!key.ok()) return key.status();
  std::string ca;
  if (!tls.client_ca_file.empty()) {
    auto read = ReadWhole("client CA", tls.client_ca_file);
    if (!read.ok()) return read.status();
    ca = std::move(*read);
  }
  ERR_clear_error();
  auto fail = [](const std::string& what, const std::string& path, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("cannot load TLS ", what, " '",
                                                   base::EscapeForLog(path), "': ", why));
  };
  std::shared_ptr<ssl::context> ctx;
  try {  // the context's constructor throws if OpenSSL cannot make one
    ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  } catch (const std::exception& e) {
    TakeOpenSslErrors();
    return absl::InternalError(absl::StrCat("cannot create a TLS context: ", e.what()));
  }
  SSL_CTX* native = ctx->native_handle();
  // No SSLv2/3, TLS 1.0/1.1; no renegotiation (a client could make the server redo the
  // expensive part of a handshake at will).
  SSL_CTX_set_options(native, SSL_OP_NO_SSLv2 | SSL_OP_NO_SSLv3 | SSL_OP_NO_TLSv1 |
                                  SSL_OP_NO_TLSv1_1 | SSL_OP_NO_RENEGOTIATION |
                                  SSL_OP_NO_COMPRESSION);
  if (SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION) != 1 ||
      // TLS 1.2: forward secrecy and AEAD only (TLS 1.3's suites are all of that).
      SSL_CTX_set_cipher_list(native,
                              "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                              "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
                              "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305") != 1) {
    return absl::InternalError(
        absl::StrCat("cannot configure TLS protocols: ", TakeOpenSslErrors()));
  }
  beast::error_code ec;
  SSL_CTX_set_default_passwd_cb(native, NoPassphrase);
  ctx->use_certificate_chain(asio::buffer(*cert), ec);
  if (ec) return fail("certificate", tls.cert_file, ErrorText(ec));
  // The key is parsed here rather than by asio: an encrypted key fails instead of OpenSSL
  // asking for a passphrase on the terminal, and a key for another certificate is named so.
  BIO* key_bio = BIO_new_mem_buf(key->data(), static_cast<int>(key->size()));
  EVP_PKEY* pkey = key_bio == nullptr
                       ? nullptr
                       : PEM_read_bio_PrivateKey(key_bio, nullptr, NoPassphrase, nullptr);
  BIO_free(key_bio);
  OPENSSL_cleanse(key->data(), key->size());  // the parsed key is all that stays in memory
  if (pkey == nullptr) {
    return fail("key", tls.key_file,
                absl::StrCat("not an unencrypted PEM private key: ", TakeOpenSslErrors()));
  }
  const bool matches = X509_check_private_key(SSL_CTX_get0_certificate(native), pkey) == 1;
  const bool used = matches && SSL_CTX_use_PrivateKey(native, pkey) == 1;
  EVP_PKEY_free(pkey);
  if (!matches) {
    TakeOpenSslErrors();
    return fail("key", tls.key_file,
                absl::StrCat("it does not match the certificate '", base::EscapeForLog(tls.cert_file),
                             "'"));
  }
  if (!used || SSL_CTX_check_private_key(native) != 1) {
    return fail("key", tls.key_file, TakeOpenSslErrors());
  }
  if (!tls.client_ca_file.empty()) {
    // Every certificate in the file is trusted, and named to clients as an acceptable issuer.
    BIO* bio = BIO_new_mem_buf(ca.data(), static_cast<int>(ca.size()));
    int added = 0;
    bool bad = bio == nullptr;
    while (!bad) {
      X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
      if (x == nullptr) break;
      if (X509_STORE_add_cert(SSL_CTX_get_cert_store(native), x) != 1 ||
          SSL_CTX_add_client_CA(native, x) != 1) {
        bad = true;
      }
      X509_free(x);
      ++added;
    }
    BIO_free(bio);
    // The loop ends on a "no start line" error past the last certificate.
    const std::string errors = TakeOpenSslErrors();
    if (bad || added == 0) {
      return fail("client CA", tls.client_ca_file,
                  added == 0 ? "no PEM certificate in it" : errors);
    }
    // A certificate is asked for but optional: without one the handlers see an empty
    // peer_identity. One that is presented must verify, or the handshake fails.
    ctx->set_verify_mode(ssl::verify_peer, ec);
    if (ec) return fail("client CA", tls.client_ca_file, ErrorText(ec));
    // Sessions are cached per context; OpenSSL refuses to resume a verified session without
    // a context id.
    static constexpr unsigned char kSessionContext[] = "strata-http";
    SSL_CTX_set_session_id_context(native, kSessionContext, sizeof(kSessionContext) - 1);
  }
  return ctx;
}

// The identity of the peer's certificate, if one was presented and verified: its first DNS
// subjectAltName, else its subject CN; empty otherwise, or if the name holds control
// characters or invalid UTF-8 (handlers log it and compare it with configured names).
std::string PeerIdentity(SSL* ssl) {
  if ((SSL_get_verify_mode(ssl) & SSL_VERIFY_PEER) == 0) return "";
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (cert == nullptr || SSL_get_verify_result(ssl) != X509_V_OK) return "";
  std::string id;
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (names != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(names) && id.empty(); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
      if (name->type == GEN_DNS) {
        id.assign(reinterpret_cast<const char*>(ASN1_STRING_get0_data(name->d.dNSName)),
                  static_cast<size_t>(ASN1_STRING_length(name->d.dNSName)));
      }
    }
    GENERAL_NAMES_free(names);
  }
  if (id.empty()) {
    X509_NAME* subject = X509_get_subject_name(cert);
    const int i = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
    if (i >= 0) {
      unsigned char* utf8 = nullptr;
      const int n =
          ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i)));
      if (n > 0) id.assign(reinterpret_cast<const char*>(utf8), static_cast<size_t>(n));
      OPENSSL_free(utf8);
    }
  }
  ERR_clear_error();
  for (char c : id) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return "";
  }
  return IsValidUtf8(id) ? id : "";
}

// Extra response header names the server writes itself: framing and connection management.
bool IsReservedHeader(std::string_view name) {
  for (std::string_view reserved :
       {"content-type", "content-length", "transfer-encoding", "connection"}) {
    if (absl::EqualsIgnoreCase(absl::string_view(name.data(), name.size()),
                               absl::string_view(reserved.data(), reserved.size()))) {
      return true;
    }
  }
  return false;
}

bool IsSafeHeaderText(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

bool IsHeaderName(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') ||
                    std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

}  // namespace

struct HttpServer::Impl {
  struct RouteEntry {
    Handler handler;
    Dispatch dispatch = Dispatch::kPool;
  };

  // One connection, over plaintext (beast::tcp_stream) or TLS
  // (beast::ssl_stream<beast::tcp_stream>). Owned by the completion handlers it has in
  // flight (shared_ptr); every operation runs on the connection's strand.
  template <class Stream>
  class Session : public std::enable_shared_from_this<Session<Stream>> {
   public:
    static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

    Session(Impl* impl, tcp::socket socket)
      requires(!kTls)
        : impl_(impl), stream_(std::move(socket)) {}
    Session(Impl* impl, tcp::socket socket, std::shared_ptr<ssl::context> tls)
      requires kTls
        : impl_(impl), tls_(std::move(tls)), stream_(std::move(socket), *tls_) {}
    ~Session() { --impl_->open; }

    void Start() {
      if constexpr (kTls) {
        Lowest().expires_after(ToChrono(impl_->options.header_timeout));
        stream_.async_handshake(ssl::stream_base::server,
                                [self = this->shared_from_this()](beast::error_code ec) {
                                  self->OnHandshake(ec);
                                });
      } else {
        ReadHeader();
      }
    }

   private:
    beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

    void OnHandshake(beast::error_code ec) {
      if (ec) {
        // Nothing to answer in: a plaintext request, an old protocol or a refused client
        // certificate already got an alert, if anything.
        ++impl_->tls_handshake_failures;
        if (ec == beast::error::timeout) ++impl_->timed_out;
        return Close();
      }
      if constexpr (kTls) peer_identity_ = PeerIdentity(stream_.native_handle());
      ReadHeader();
    }

    // Between kept-alive requests: the next request's first byte may take idle_timeout;
    // from there, its header has header_timeout like any other.
    void AwaitRequest() {
      if (buffer_.size() > 0) return ReadHeader();  // pipelined
      Lowest().expires_after(ToChrono(impl_->options.idle_timeout));
      stream_.async_read_some(buffer_.prepare(kFirstRead),
                              [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                                self->buffer_.commit(n);
                                if (ec) return self->Fail(ec);
                                self->ReadHeader();
                              });
    }

    void ReadHeader() {
      parser_.emplace();
      parser_->header_limit(impl_->options.max_header_bytes);
      parser_->body_limit(impl_->options.max_body_bytes);
      Lowest().expires_after(ToChrono(impl_->options.header_timeout));
      http::async_read_header(stream_, buffer_, *parser_,
                              [self = this->shared_from_this()](beast::error_code ec, size_t) {
                                self->OnHeader(ec);
                              });
    }

    void OnHeader(beast::error_code ec) {
      if (ec) return Fail(ec);
      Lowest().expires_after(ToChrono(impl_->options.body_timeout));
      http::async_read(stream_, buffer_, *parser_,
                       [self = this->shared_from_this()](beast::error_code ec, size_t) {
                         self->OnRequest(ec);
                       });
    }

    void OnRequest(beast::error_code ec) {
      if (ec) return Fail(ec);
      ++impl_->requests;
      http::request<http::string_body> req = parser_->release();
      keep_alive_ = req.keep_alive();
      version_ = req.version();
      HttpRequest request;
      if (!Parse(std::move(req), &request)) {
        ++impl_->bad_requests;
        keep_alive_ = false;
        return Respond({400, "text/plain; charset=utf-8",
                        "malformed request: the path and query must be valid UTF-8\n"});
      }
      request.secure = kTls;
      request.peer_identity = peer_identity_;
      auto route = impl_->routes.find(request.path);
      if (route == impl_->routes.end()) {
        return Respond({404, "text/plain; charset=utf-8",
                        absl::StrCat("no such path: ", base::EscapeForLog(request.path), "\n")});
      }
      const RouteEntry& entry = route->second;
      switch (entry.dispatch) {
        case Dispatch::kInline:
          return Respond(entry.handler(request));
        case Dispatch::kPriority:
          return RunOn(*impl_->priority, entry.handler, std::move(request));
        case Dispatch::kPool:
          return RunOn(*impl_->pool, entry.handler, std::move(request));
      }
    }

    // Runs `handler` on `pool`; the response comes back to the connection's strand. Routes
    // do not change after Start(), so the handler outlives the task.
    void RunOn(asio::thread_pool& pool, const Handler& handler, HttpRequest request) {
      asio::post(pool, [self = this->shared_from_this(), &handler,
                        request = std::move(request)] {
        HttpResponse response = handler(request);
        asio::post(self->stream_.get_executor(),
                   [self, response = std::move(response)]() mutable {
                     self->Respond(std::move(response));
                   });
      });
    }

    static bool Parse(http::request<http::string_body> req, HttpRequest* out) {
      out->method = std::string(req.method_string());
      std::string_view target(req.target().data(), req.target().size());
      const size_t q = target.find('?');
      out->path = UrlDecode(target.substr(0, q));
      if (!IsValidUtf8(out->path)) return false;
      if (q != std::string_view::npos) {
        const std::string_view params = target.substr(q + 1);
        for (absl::string_view part :
             absl::StrSplit(absl::string_view(params.data(), params.size()), '&',
                            absl::SkipEmpty())) {
          const std::string_view kv(part.data(), part.size());
          const size_t eq = kv.find('=');
          std::string key = UrlDecode(kv.substr(0, eq));
          std::string value = eq == std::string_view::npos ? "" : UrlDecode(kv.substr(eq + 1));
          if (!IsValidUtf8(key) || !IsValidUtf8(value)) return false;
          out->query[std::move(key)] = std::move(value);
        }
      }
      const auto auth = req.find(http::field::authorization);
      if (auth != req.end()) out->authorization = std::string(auth->value());
      out->body = std::move(req.body());
      return true;
    }

    void Respond(HttpResponse response) {
      response_.emplace(static_cast<http::status>(response.status), version_);
      response_->set(http::field::server, "strata-server");
      response_->set(http::field::content_type, response.content_type);
      for (const auto& [name, value] : response.headers) {
        if (IsHeaderName(name) && IsSafeHeaderText(value) && !IsReservedHeader(name)) {
          response_->insert(name, value);
        }
      }
      response_->keep_alive(keep_alive_);
      response_->body() = std::move(response.body);
      response_->prepare_payload();
      Lowest().expires_after(ToChrono(impl_->options.body_timeout));
      http::async_write(stream_, *response_,
                        [self = this->shared_from_this()](beast::error_code ec, size_t) {
                          self->OnWritten(ec);
                        });
    }

    void OnWritten(beast::error_code ec) {
      if (ec) return Fail(ec);
      if (!keep_alive_) return Close();
      response_.reset();
      AwaitRequest();
    }

    void Fail(beast::error_code ec) {
      if (ec == beast::error::timeout) {
        ++impl_->timed_out;
      } else if (ec != http::error::end_of_stream && ec != asio::error::eof &&
                 ec != asio::error::connection_reset && ec != asio::error::broken_pipe &&
                 ec != asio::error::operation_aborted &&
                 // A TLS record layer error (or a peer gone without close_notify): the
                 // connection cannot carry an answer.
                 ec.category() != asio::error::get_ssl_category() &&
                 ec != ssl::error::stream_truncated) {
        // Malformed or over a limit: say so if the connection still takes it.
        ++impl_->bad_requests;
        if (!responded_bad_) {
          responded_bad_ = true;
          keep_alive_ = false;
          const bool too_large =
              ec == http::error::body_limit || ec == http::error::header_limit;
          return Respond({too_large ? 413 : 400, "text/plain; charset=utf-8",
                          too_large ? "request header or body too large\n"
                                    : "malformed request\n"});
        }
      }
      Close();
    }

    // Over TLS without close_notify: responses are length-delimited, so a client can tell a
    // truncated one anyway, and waiting for the peer's close_notify would hold the
    // connection open on the client's terms.
    void Close() {
      beast::error_code ignored;
      Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
      Lowest().close();
    }

    // The first read of a kept-alive connection; the header parser reads the rest.
    static constexpr size_t kFirstRead = 1024;

    Impl* const impl_;
    // The context this connection was created with; declared before the stream, which uses
    // it until destroyed. Later rotations do not affect it.
    std::shared_ptr<ssl::context> tls_;
    Stream stream_;
    std::string peer_identity_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::optional<http::response<http::string_body>> response_;
    bool keep_alive_ = false;
    bool responded_bad_ = false;
    unsigned version_ = 11;
  };

  using PlainSession = Session<beast::tcp_stream>;
  using TlsSession = Session<beast::ssl_stream<beast::tcp_stream>>;

  // The context for a new connection. At most once a second, looks at the files: when
  // they changed since the last look, builds a context from them; if that fails (a
  // half-written file, a key that does not match yet) the current context stays and the
  // error is logged once for this set of files.
  std::shared_ptr<ssl::context> TlsContextForNewConnection() {
    std::lock_guard<std::mutex> lock(tls_mu);
    const auto now = std::chrono::steady_clock::now();
    if (now - tls_checked < std::chrono::seconds(1)) return tls_context;
    tls_checked = now;
    TlsStamp stamp = StampAll(options.tls);
    if (stamp == tls_stamp) return tls_context;
    tls_stamp = stamp;
    auto built = BuildTlsContext(options.tls);
    if (!built.ok()) {
      spdlog::error("http: TLS certificate files changed but cannot be loaded, still serving "
                    "the previous certificate: {}",
                    built.status().ToString());
      return tls_context;
    }
    tls_context = std::move(*built);
    spdlog::info("http: loaded the changed TLS certificate '{}'",
                 base::EscapeForLog(options.tls.cert_file));
    return tls_context;
  }

  static std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        absl::ToChronoNanoseconds(d));
  }

  void Accept() {
    acceptor->async_accept(asio::make_strand(*io), [this](beast::error_code ec,
                                                          tcp::socket socket) {
      if (stopped) return;
      if (ec) {
        // Typically out of file descriptors: try again shortly instead of spinning.
        accept_retry->expires_after(std::chrono::milliseconds(100));
        accept_retry->async_wait([this](beast::error_code) {
          if (!stopped) Accept();
        });
        return;
      }
      if (open.load() >= options.max_connections) {
        // Over the limit: a reset at once, so the client neither waits nor holds a slot.
        ++refused;
        beast::error_code ignored;
        socket.set_option(asio::socket_base::linger(true, 0), ignored);
        socket.close(ignored);
      } else {
        ++open;
        ++connections;
        if (tls_on) {
          std::shared_ptr<TlsSession> session;
          try {  // OpenSSL out of memory for a new connection (SSL_new): drop just that one
            session = std::make_shared<TlsSession>(this, std::move(socket),
                                                   TlsContextForNewConnection());
          } catch (const std::exception& e) {
            --open;  // no Session to do it
            ++tls_handshake_failures;
            spdlog::error("http: cannot start a TLS connection: {}", e.what());
          }
          if (session != nullptr) session->Start();
        } else {
          std::make_shared<PlainSession>(this, std::move(socket))->Start();
        }
      }
      Accept();
    });
  }

  // Declared before the I/O objects: sessions still queued in `io` or in a pool reach the
  // options and counters when they are destroyed.
  HttpServerOptions options;
  std::map<std::string, RouteEntry> routes;
  std::atomic<bool> stopped{false};
  std::atomic<int64_t> open{0};
  std::atomic<uint64_t> connections{0}, refused{0}, timed_out{0}, bad_requests{0}, requests{0};
  std::atomic<uint64_t> tls_handshake_failures{0};
  int bound_port = 0;

  // HTTPS: the context new connections get (set by Start, then only replaced), and what
  // its files looked like when last examined.
  bool tls_on = false;
  std::mutex tls_mu;
  std::shared_ptr<ssl::context> tls_context;
  TlsStamp tls_stamp;
  std::chrono::steady_clock::time_point tls_checked;

  std::unique_ptr<asio::io_context> io;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::unique_ptr<asio::steady_timer> accept_retry;
  std::unique_ptr<asio::thread_pool> pool;
  std::unique_ptr<asio::thread_pool> priority;
  std::vector<std::thread> threads;
};

HttpServer::HttpServer() : impl_(std::make_unique<Impl>()) {}
HttpServer::~HttpServer() { Stop(); }

void HttpServer::Route(const std::string& path, Handler handler, Dispatch dispatch) {
  impl_->routes[path] = {std::move(handler), dispatch};
}

absl::Status HttpServer::Start(const std::string& address, const HttpServerOptions& options) {
  if (impl_->io != nullptr || impl_->stopped) {
    return absl::FailedPreconditionError("an HTTP server starts once");
  }
  if (options.io_threads < 1 || options.handler_threads < 1 || options.max_connections < 1) {
    return absl::InvalidArgumentError(
        "the HTTP server needs an I/O thread, a handler thread and a connection");
  }
  auto hp = SplitHostPort(address);
  if (!hp.ok()) return hp.status();
  beast::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(hp->first, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad HTTP address '", base::EscapeForLog(address), "'"));
  }
  const tcp::endpoint endpoint(ip, static_cast<unsigned short>(hp->second));
  std::shared_ptr<ssl::context> tls_context;
  TlsStamp tls_stamp;
  const HttpServerOptions::Tls& tls = options.tls;
  if (!tls.cert_file.empty()) {
    if (tls.key_file.empty()) {
      return absl::InvalidArgumentError("a TLS certificate needs its key (tls.key_file)");
    }
    // Stamped before reading: a file replaced in between is seen as changed at the next
    // look and loaded again.
    tls_stamp = StampAll(tls);
    auto built = BuildTlsContext(tls);
    if (!built.ok()) return built.status();
    tls_context = std::move(*built);
  } else if (!tls.key_file.empty() || !tls.client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS key or client CA without a certificate (tls.cert_file)");
  }
  auto io = std::make_unique<asio::io_context>(options.io_threads);
  auto acceptor = std::make_unique<tcp::acceptor>(*io);
  acceptor->open(endpoint.protocol(), ec);
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor->bind(endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  tcp::endpoint bound;
  if (!ec) bound = acceptor->local_endpoint(ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ",
                                               base::EscapeForLog(address), ": ", ec.message()));
  }
  Impl& s = *impl_;
  s.options = options;
  s.bound_port = bound.port();
  s.tls_on = tls_context != nullptr;
  s.tls_context = std::move(tls_context);
  s.tls_stamp = std::move(tls_stamp);
  s.tls_checked = std::chrono::steady_clock::now();
  s.io = std::move(io);
  s.acceptor = std::move(acceptor);
  s.accept_retry = std::make_unique<asio::steady_timer>(*s.io);
  s.pool = std::make_unique<asio::thread_pool>(static_cast<size_t>(options.handler_threads));
  s.priority = std::make_unique<asio::thread_pool>(1);
  s.Accept();
  for (int i = 0; i < options.io_threads; ++i) {
    s.threads.emplace_back([&s] { s.io->run(); });
  }
  return absl::OkStatus();
}

int HttpServer::port() const { return impl_->bound_port; }

HttpServerStats HttpServer::stats() const {
  const Impl& s = *impl_;
  HttpServerStats stats;
  stats.open_connections = s.open.load();
  stats.connections = s.connections.load();
  stats.refused_connections = s.refused.load();
  stats.timed_out = s.timed_out.load();
  stats.bad_requests = s.bad_requests.load();
  stats.requests = s.requests.load();
  stats.tls_handshake_failures = s.tls_handshake_failures.load();
  return stats;
}

void HttpServer::Stop() {
  Impl& s = *impl_;
  if (s.io == nullptr || s.stopped.exchange(true)) return;
  // No more I/O: then no more work reaches the pools.
  s.io->stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
  // Handlers already running finish (their responses are dropped); queued ones are not run.
  for (asio::thread_pool* p : {s.pool.get(), s.priority.get()}) {
    p->stop();
    p->join();
  }
  // Destroying what still holds sessions closes their sockets: the pools' queued tasks
  // first, then the acceptor, then the I/O context with its pending operations.
  s.pool.reset();
  s.priority.reset();
  s.accept_retry.reset();
  s.acceptor.reset();
  s.io.reset();
}

}  // namespace strata::server::http
