// The socket paths a daemon and its trainers agree on, and the checks both sides make on them
// (socket_paths.h).
#include "proto/contract/socket_paths.h"

#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace spex {
namespace {
std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// "uid 1002 (bob)" or "uid 1002".
std::string Who(uid_t uid) {
  passwd pw;
  passwd* found = nullptr;
  char buf[1024];
  if (getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found != nullptr) {
    return absl::StrCat("uid ", uid, " (", found->pw_name, ")");
  }
  return absl::StrCat("uid ", uid);
}

constexpr char kFix[] =
    "remove it (its owner or root can) or use a socket in a directory only you can write, e.g. "
    "spexd --socket=$XDG_RUNTIME_DIR/spex/node.sock (trainers: SPEX_SOCKET)";

// One directory on the way to `dir` (final: `dir` itself), as lstat saw it.
absl::Status CheckComponent(const std::string& path, const struct stat& st, bool final,
                            uid_t trusted) {
  const bool owner_ok = st.st_uid == trusted || st.st_uid == 0;
  if (S_ISLNK(st.st_mode)) {
    if (owner_ok) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat(path, " is a symlink owned by ", Who(st.st_uid), ", not by ", Who(trusted),
                     " or root: that user decides where the socket goes; ", kFix));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  }
  if (final ? st.st_uid != trusted : !owner_ok) {
    return absl::PermissionDeniedError(absl::StrCat(
        "socket directory ", path, " is owned by ", Who(st.st_uid), ", not by ", Who(trusted),
        final ? "" : " or root",
        ": another user may have created it to take over the daemon's socket; ", kFix));
  }
  const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
  if (others_write && (final || !(st.st_mode & S_ISVTX))) {
    return absl::PermissionDeniedError(
        absl::StrCat("socket directory ", path, " (mode ", absl::Hex(st.st_mode & 07777),
                     ") may be written by other users, who could replace the socket; chmod go-w ",
                     path, " or ", kFix));
  }
  return absl::OkStatus();
}

// CheckComponent for every prefix of absolute `dir` (lstat: symlinks are checked, not followed);
// `dir` itself as the final directory when `final_last`.
absl::Status CheckChain(const std::string& dir, uid_t trusted, bool final_last = true) {
  std::vector<std::string> prefixes = {"/"};
  for (size_t pos = dir.find('/', 1); pos != std::string::npos; pos = dir.find('/', pos + 1)) {
    prefixes.push_back(dir.substr(0, pos));
  }
  if (dir.size() > 1 && dir.back() != '/') prefixes.push_back(dir);
  for (size_t i = 0; i < prefixes.size(); ++i) {
    struct stat st;
    if (lstat(prefixes[i].c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("cannot stat ", prefixes[i], ": ", strerror(errno)));
    }
    if (absl::Status s =
            CheckComponent(prefixes[i], st, final_last && i + 1 == prefixes.size(), trusted);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status CheckPrivateDirectory(const std::string& dir, uid_t trusted) {
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("'", dir, "' is not an absolute directory"));
  }
  if (absl::Status s = CheckChain(dir, trusted); !s.ok()) return s;
  // Symlinks on the way were owned by trusted users; the directories they lead to are checked
  // too.
  char resolved[PATH_MAX];
  if (realpath(dir.c_str(), resolved) == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot resolve ", dir, ": ", strerror(errno)));
  }
  return resolved == dir ? absl::OkStatus() : CheckChain(resolved, trusted);
}

absl::StatusOr<uid_t> CheckServerSocket(const std::string& socket,
                                        const std::vector<uid_t>& trusted) {
  sockaddr_un addr{};
  if (socket.empty() || socket.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", socket, "' must be 1..",
                                                   sizeof(addr.sun_path) - 1, " characters"));
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket.data(), socket.size());
  ucred cred{};
  socklen_t len = sizeof(cred);
  const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  const int err = errno;
  const bool known = connected && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
  close(fd);
  if (!connected) {
    return absl::UnavailableError(absl::StrCat("cannot connect to spexd at ", socket, ": ",
                                               strerror(err), " (is the daemon running?)"));
  }
  if (!known) return absl::InternalError(absl::StrCat("SO_PEERCRED on ", socket));
  std::vector<uid_t> ok = trusted;
  for (absl::string_view part : absl::StrSplit(Env("SPEX_TRUST_SERVER_UIDS"), ',')) {
    uint32_t uid = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &uid)) ok.push_back(uid);
  }
  const uid_t server = cred.uid;
  if (server != getuid() && server != 0 && std::find(ok.begin(), ok.end(), server) == ok.end()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the process listening at ", socket, " (pid ", cred.pid, ") runs as ", Who(server),
        ", not as you or root (you are ", Who(getuid()),
        "): it may be another user's impostor waiting for your gradients. Use your own "
        "daemon's socket; if this is your site's shared daemon, set SPEX_TRUST_SERVER_UIDS=",
        server));
  }
  const size_t slash = socket.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : socket.substr(0, slash);
  if (dir[0] != '/') {
    // A relative socket: its directory from the working directory (CheckPrivateDirectory checks
    // the chain as written and, when it differs, the resolved one; "." and ".." are resolved).
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot check the directory of the relative socket path ", socket,
                       ": getcwd: ", strerror(errno), "; give an absolute path"));
    }
    const std::string base = cwd;
    dir = dir == "." ? base : absl::StrCat(base == "/" ? "" : base, "/", dir);
  }
  {
    absl::Status mine = CheckPrivateDirectory(dir, getuid());
    if (!mine.ok() && server != getuid() && CheckPrivateDirectory(dir, server).ok()) {
      mine = absl::OkStatus();
    }
    // A sticky directory (as /tmp) is safe too when the socket file is the server's or ours:
    // nobody else may remove or rename it there.
    struct stat d, f;
    if (!mine.ok() && stat(dir.c_str(), &d) == 0 && (d.st_mode & S_ISVTX) &&
        lstat(socket.c_str(), &f) == 0 && S_ISSOCK(f.st_mode) &&
        (f.st_uid == getuid() || f.st_uid == server) &&
        CheckChain(dir, getuid(), /*final_last=*/false).ok()) {
      mine = absl::OkStatus();
    }
    if (!mine.ok()) {
      return absl::Status(mine.code(), absl::StrCat("spexd at ", socket, ": ", mine.message()));
    }
  }
  return server;
}

std::string DefaultSocketBase() {
  const std::string runtime = Env("XDG_RUNTIME_DIR");
  struct stat st;
  if (!runtime.empty() && runtime[0] == '/' && stat(runtime.c_str(), &st) == 0 &&
      S_ISDIR(st.st_mode) && st.st_uid == getuid() && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0) {
    return absl::StrCat(runtime, "/spex");
  }
  return absl::StrCat("/tmp/spex-", getuid());
}

std::string DefaultJob() {
  std::string job = Env("SPEX_JOB");
  if (job.empty()) job = Env("SLURM_JOB_ID");
  return job.empty() ? "default" : job;
}

std::string Hostname() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

std::string DefaultSocketPath(const std::string& job, int local_index) {
  std::string path = absl::StrCat(DefaultSocketBase(), "/", job, "/", Hostname());
  if (local_index >= 0) absl::StrAppend(&path, ".", local_index);
  return path + ".sock";
}

std::string ClientSocketPath(const std::string& job) {
  std::string explicit_path = Env("SPEX_SOCKET");
  if (!explicit_path.empty()) return explicit_path;
  std::string idx = Env("SPEX_LOCAL_DAEMON");
  return DefaultSocketPath(job, idx.empty() ? -1 : std::atoi(idx.c_str()));
}

absl::Status PrepareSocketPath(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' must be 1..",
                                                   sizeof(addr.sun_path) - 1, " characters"));
  }
  // Nothing is created inside a directory another user controls: the deepest existing one on
  // the way is checked first.
  std::string existing = "/";
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    if (access(path.substr(0, pos).c_str(), F_OK) != 0) break;
    existing = path.substr(0, pos);
  }
  if (path[0] == '/') {
    if (absl::Status s = CheckChain(existing, geteuid(), /*final_last=*/false); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--socket ", path, ": ", s.message()));
    }
  }
  // Create parent directories (0700: only this user may reach the socket).
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    std::string dir = path.substr(0, pos);
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create ", dir, ": ", strerror(errno)));
    }
  }
  // What the socket goes into must be this user's alone: another user who made (or can change)
  // the directory could swap the socket for one of their own and see every gradient.
  const size_t slash = path.rfind('/');
  std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (parent[0] != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == nullptr) {
      return absl::InternalError(absl::StrCat("getcwd: ", strerror(errno)));
    }
    parent = absl::StrCat(cwd, "/", parent);
  }
  if (absl::Status s = CheckPrivateDirectory(parent, geteuid()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--socket ", path, ": ", s.message()));
  }
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::AlreadyExistsError(
        absl::StrCat(path, " exists and is not a socket; choose another --socket"));
  }
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  const bool live = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  if (live) {
    return absl::AlreadyExistsError(absl::StrCat("a daemon is already serving at ", path,
                                                 "; stop it or pass another --socket"));
  }
  if (unlink(path.c_str()) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot remove stale socket ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace spex
