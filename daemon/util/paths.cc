#include "daemon/util/paths.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace spex {
namespace {
std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}
}  // namespace

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
  std::string path = absl::StrCat("/tmp/spex-", getuid(), "/", job, "/", Hostname());
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
  // Create parent directories (0700: only this user may reach the socket).
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    std::string dir = path.substr(0, pos);
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create ", dir, ": ", strerror(errno)));
    }
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
