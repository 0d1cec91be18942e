// The web UI's static files (index.html, app.js, timeline.js, style.css), compiled into the
// server binary from server/web/ at build time (embed.cmake) so the UI needs no files or
// network at run time. The data is static and immutable; callers borrow it for the life of
// the process.
#ifndef STRATA_SERVER_WEB_ASSETS_H_
#define STRATA_SERVER_WEB_ASSETS_H_

#include <span>
#include <string_view>

namespace strata::server::web {

struct Asset {
  std::string_view path;          // URL path ("/" for index.html, "/ui/<file>" otherwise)
  std::string_view content_type;
  std::string_view body;
};

std::span<const Asset> Assets();

}  // namespace strata::server::web

#endif  // STRATA_SERVER_WEB_ASSETS_H_
