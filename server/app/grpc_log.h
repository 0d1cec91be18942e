// gRPC's own log lines, routed into the server's log, and the one among them the server must
// act on.
//
// gRPC 1.51 stops listening on a port for good after any accept4() error other than EAGAIN,
// EINTR or ECONNABORTED, most often EMFILE (the process out of open files): it logs "Failed
// accept4: ..." and serves the connections it has, but the kernel queues new ones that nobody
// takes (grpc#16058). Agents that reconnect, CLI queries and OTLP senders then hang until
// their deadlines, and only a restart listens again. The server's answer (server_app.cc) is to
// shut down cleanly, writing what it accepted, and exit with status 1 for its supervisor to
// restart it.
#ifndef STRATA_SERVER_APP_GRPC_LOG_H_
#define STRATA_SERVER_APP_GRPC_LOG_H_

#include <functional>
#include <string_view>

namespace strata::server::app {

// Whether gRPC's log line `message` says its listener gave up (see above).
bool IsListenerLost(std::string_view message);

// Whether gRPC's error line `message` is a client's doing that the server serves anyway, to be
// logged at debug level rather than as an error at every connection: "No match found for
// server name: X" (a client asked, by SNI, for a name the server has no certificate of its
// own for; it gets the server's only certificate, and refuses it itself if it does not match).
bool IsClientsDoing(std::string_view message);

// From now on gRPC's log lines go to the server's log (LogError and LogInfo, with gRPC's
// source file and line), and the first that IsListenerLost() calls `on_listener_lost` with
// its text. gRPC may hold its own locks while it logs: the callback must not call into gRPC.
// Set once per process, before the gRPC server starts.
void RouteGrpcLog(std::function<void(std::string_view message)> on_listener_lost);

}  // namespace strata::server::app

#endif  // STRATA_SERVER_APP_GRPC_LOG_H_
