// The control socket's listener (peer_listener.h): accept, SO_PEERCRED, refuse or hand to gRPC.
#include "daemon/service/peer_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/util/log.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"

namespace spex {
namespace {

// Numbers below this are left to the rest of the process (shm_open, files, MPI).
constexpr int kFirstCycled = 256;
// Refusals logged one by one before the log only counts them.
constexpr uint64_t kWarnFirst = 10;

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

bool PeerListener::Owner(uint32_t uid) { return uid == 0 || uid == geteuid(); }

absl::StatusOr<std::unique_ptr<PeerListener>> PeerListener::Listen(ListenerOptions options) {
  sockaddr_un addr{};
  if (options.path.empty() || options.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", options.path, "' must be 1..",
                                                   sizeof(addr.sun_path) - 1, " characters"));
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError("--max_connections must be >= 1");
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket(AF_UNIX)");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, options.path.data(), options.path.size());
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    absl::Status s = Errno(absl::StrCat("cannot bind unix:", options.path));
    close(fd);
    return s;
  }
  if (chmod(options.path.c_str(), options.mode) != 0) {
    absl::Status s = absl::PermissionDeniedError(
        absl::StrCat("--socket_mode: chmod ", options.path, ": ", std::strerror(errno)));
    close(fd);
    unlink(options.path.c_str());
    return s;
  }
  if (listen(fd, 128) != 0) {
    absl::Status s = Errno(absl::StrCat("listen(", options.path, ")"));
    close(fd);
    unlink(options.path.c_str());
    return s;
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    absl::Status s = Errno("eventfd");
    close(fd);
    unlink(options.path.c_str());
    return s;
  }
  return std::unique_ptr<PeerListener>(new PeerListener(std::move(options), fd, wake));
}

PeerListener::PeerListener(ListenerOptions options, int fd, int wake)
    : options_(std::move(options)), fd_(fd), wake_(wake) {
  // The cycle spans what the descriptor limit allows (the soft limit raised to the hard one).
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 1 << 20);
    setrlimit(RLIMIT_NOFILE, &lim);
    getrlimit(RLIMIT_NOFILE, &lim);
  }
  const int limit = static_cast<int>(std::min<rlim_t>(lim.rlim_cur, 1 << 20));
  // Keep a quarter of the range (and at least 64) for everything else.
  ceiling_ = std::max(kFirstCycled + 2 * options_.max_connections, limit - limit / 4);
  floor_ = kFirstCycled;
}

PeerListener::~PeerListener() {
  Stop();
  absl::MutexLock lock(&mu_);
  for (auto& [n, c] : conns_) close(c.watch);
  conns_.clear();
  counts_.open = 0;
}

void PeerListener::Serve(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void PeerListener::Stop() {
  if (stopped_.exchange(true)) return;
  const uint64_t one = 1;
  if (write(wake_, &one, sizeof(one)) < 0) {
    SPEX_LOG(WARNING) << "listener: cannot wake the accept thread: " << std::strerror(errno);
  }
  if (thread_.joinable()) thread_.join();
  close(fd_);
  close(wake_);
  // The connections stay known: calls in flight during the server's shutdown still need their
  // callers (the destructor forgets them).
}

bool PeerListener::Allowed(uint32_t uid) const {
  return Owner(uid) || std::find(options_.allow_uids.begin(), options_.allow_uids.end(), uid) !=
                           options_.allow_uids.end();
}

int PeerListener::CycleNumber(int fd) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (floor_ >= ceiling_) floor_ = kFirstCycled;
    const int n = fcntl(fd, F_DUPFD_CLOEXEC, floor_);
    if (n >= 0 && n < ceiling_) {
      floor_ = n + 1;
      return n;
    }
    if (n >= 0) close(n);
    floor_ = ceiling_;  // wrap
  }
  return -1;
}

void PeerListener::Accept(grpc::Server* server) {
  const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (c < 0) {
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
      SPEX_LOG(WARNING) << "accept on " << options_.path << ": " << std::strerror(errno);
      // Out of descriptors (EMFILE) and the like: do not spin on the readable socket.
      usleep(10 * 1000);
    }
    return;
  }
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    SPEX_LOG(WARNING) << "SO_PEERCRED: " << std::strerror(errno) << "; connection closed";
    close(c);
    return;
  }
  const PeerCred peer{static_cast<uint32_t>(cred.uid), static_cast<uint32_t>(cred.gid),
                      static_cast<uint32_t>(cred.pid)};
  absl::MutexLock lock(&mu_);
  const char* refused = nullptr;
  if (!Allowed(peer.uid)) {
    ++counts_.refused_user;
    refused = "this user may not use this daemon (it serves its own user; see --allow_uids)";
  } else if (counts_.open >= options_.max_connections) {
    ++counts_.refused_full;
    refused = "--max_connections connections are open";
  }
  if (refused != nullptr) {
    close(c);
    const uint64_t n = counts_.refused_user + counts_.refused_full;
    if (++warned_ <= kWarnFirst || n % 1000 == 0) {
      SPEX_LOG(WARNING) << "refused a connection from uid " << peer.uid << " pid " << peer.pid
                        << ": " << refused << " (" << n << " refused so far)";
    }
    return;
  }
  const int n = CycleNumber(c);
  if (n < 0) {
    SPEX_LOG(WARNING) << "no descriptor for a connection of uid " << peer.uid << " pid " << peer.pid
                      << ": " << std::strerror(errno) << "; closed";
    close(c);
    return;
  }
  conns_[n] = Conn{peer, c};
  ++counts_.accepted;
  ++counts_.open;
  grpc::AddInsecureChannelFromFd(server, n);  // gRPC owns `n` from here on
}

void PeerListener::AcceptLoop(grpc::Server* server) {
  std::vector<pollfd> fds;
  std::vector<int> keys;
  while (!stopped_.load()) {
    fds.clear();
    keys.clear();
    fds.push_back({wake_, POLLIN, 0});
    fds.push_back({fd_, POLLIN, 0});
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [n, c] : conns_) {
        fds.push_back({c.watch, POLLRDHUP, 0});
        keys.push_back(n);
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      SPEX_LOG(ERROR) << "listener poll: " << std::strerror(errno);
      usleep(10 * 1000);
      continue;
    }
    if (fds[0].revents != 0) break;
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto it = conns_.find(keys[i - 2]);
        if (it == conns_.end() || it->second.watch != fds[i].fd) continue;
        close(it->second.watch);
        conns_.erase(it);
        --counts_.open;
      }
    }
    if (fds[1].revents & POLLIN) Accept(server);
  }
}

std::optional<PeerCred> PeerListener::Lookup(absl::string_view peer) const {
  int n = 0;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &n)) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = conns_.find(n);
  if (it == conns_.end()) return std::nullopt;
  return it->second.cred;
}

PeerListener::Counts PeerListener::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

}  // namespace spex
