// The control socket's listener. spexd accepts connections itself, instead of letting gRPC
// listen, so that every caller is known by the kernel's word (SO_PEERCRED: uid, gid, pid at
// connect time) and not by what a request says: gRPC 1.51 gives a unix-socket call no peer
// credentials, only a peer name. Each accepted connection is handed to the gRPC server with
// grpc::AddInsecureChannelFromFd, which names its calls' peer "fd:<N>"; Lookup maps that name
// back to the credentials recorded at accept. Connections from users other than the daemon's,
// root and --allow_uids are closed at once, and at most --max_connections are open.
//
// The fd number handed to gRPC is taken from a cycle over the process's descriptor range
// (F_DUPFD from a moving floor), so a number comes back to a new connection only after the
// whole range has been used, never while a call of the previous connection could still look
// it up (see docs/security.md).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace grpc {
class Server;
}

namespace spex {

// Who is at the other end of a connection, as the kernel saw it at connect().
struct PeerCred {
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t pid = 0;  // 0: the caller is in a PID namespace this daemon cannot see into
};

struct ListenerOptions {
  std::string path;                  // the unix socket (its directory already checked)
  mode_t mode = 0600;                // the socket file's mode
  std::vector<uint32_t> allow_uids;  // besides this daemon's uid and root
  int max_connections = 64;
};

class PeerListener {
 public:
  // Binds and listens on options.path (mode set before listen(), so no connection sees
  // another mode). Connections wait in the backlog until Serve().
  static absl::StatusOr<std::unique_ptr<PeerListener>> Listen(ListenerOptions options);
  ~PeerListener();  // Stop(), then closes this listener's own copies of the connections
  PeerListener(const PeerListener&) = delete;
  PeerListener& operator=(const PeerListener&) = delete;

  // Starts the accept thread: every allowed connection goes to `server` (already started).
  void Serve(grpc::Server* server);
  // Ends the accept thread and closes the listening socket; connections already handed over stay
  // known to Lookup until the destructor (gRPC closes its copies at its shutdown). Idempotent.
  void Stop();

  // The credentials of the connection a gRPC call names `peer` ("fd:<N>"); nullopt for a name
  // this listener did not hand out or a connection that has closed.
  std::optional<PeerCred> Lookup(absl::string_view peer) const;
  // Whether `uid` may open sessions and change the daemon (its own user and root).
  static bool Owner(uint32_t uid);

  struct Counts {
    uint64_t accepted = 0;      // handed to gRPC
    uint64_t refused_user = 0;  // closed: a user not allowed to connect
    uint64_t refused_full = 0;  // closed: --max_connections open already
    int open = 0;
  };
  Counts counts() const;
  const std::string& path() const { return options_.path; }

 private:
  PeerListener(ListenerOptions options, int fd, int wake);
  void AcceptLoop(grpc::Server* server);
  void Accept(grpc::Server* server);
  bool Allowed(uint32_t uid) const;
  // A descriptor number for gRPC from the moving floor (see above); -1 on failure.
  int CycleNumber(int fd);

  const ListenerOptions options_;
  int fd_;    // listening socket
  int wake_;  // eventfd: Stop() wakes the accept thread
  int floor_ = 0;
  int ceiling_ = 0;
  std::thread thread_;
  std::atomic<bool> stopped_{false};

  struct Conn {
    PeerCred cred;
    int watch = -1;  // our own copy of the socket: POLLRDHUP when the peer goes
  };
  mutable absl::Mutex mu_;
  std::map<int, Conn> conns_ ABSL_GUARDED_BY(mu_);  // by the number gRPC has
  Counts counts_ ABSL_GUARDED_BY(mu_);
  uint64_t warned_ ABSL_GUARDED_BY(mu_) = 0;  // refusals logged (the first few only)
};

}  // namespace spex
