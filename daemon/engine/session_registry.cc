// The node's trainer sessions (session_registry.h): Hello/Goodbye bookkeeping, the owner check
// of every session request, and noticing trainers that died without Goodbye (pidfd).
#include "daemon/engine/session_registry.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "daemon/util/log.h"

namespace spex {

namespace {

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

// A pidfd for `pid`, or -1 (the pid is 0, gone already, or not visible from this daemon).
int OpenPidfd(uint32_t pid) {
  if (pid == 0) return -1;
  const long fd = syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0);
  if (fd < 0) {
    SPEX_LOG(WARNING) << "cannot watch trainer pid " << pid << " (" << std::strerror(errno)
                      << "): its death will be noticed only by the exchange timeout (is it in "
                         "another PID namespace?)";
    return -1;
  }
  return static_cast<int>(fd);
}

}  // namespace

SessionRegistry::SessionRegistry(int local_trainers, std::string job)
    : local_trainers_(local_trainers), job_(std::move(job)) {}

SessionRegistry::~SessionRegistry() {
  for (auto& [id, s] : sessions_) {
    if (s->pidfd >= 0) close(s->pidfd);
  }
}

std::vector<Session> SessionRegistry::Reap() {
  std::vector<Session> dead;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    Session& s = *it->second;
    if (s.pidfd >= 0) {
      pollfd p{s.pidfd, POLLIN, 0};
      if (poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
        close(s.pidfd);
        s.pidfd = -1;
        dead.push_back(s);
        it = sessions_.erase(it);
        continue;
      }
    }
    ++it;
  }
  return dead;
}

absl::StatusOr<Session*> SessionRegistry::Open(const std::string& job, uint32_t local_rank,
                                               uint32_t local_size, uint32_t pid,
                                               const std::string& client, uint32_t uid) {
  if (!job_.empty() && job != job_) {
    return absl::FailedPreconditionError(
        absl::StrCat("this spexd serves job '", job_, "', the trainer says job '", job, "'"));
  }
  if (local_size != static_cast<uint32_t>(local_trainers_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this spexd expects ", local_trainers_,
        " local trainers (--local_trainers), the trainer says local_size=", local_size,
        "; start the daemon with --local_trainers=", local_size, " or fix the trainer"));
  }
  if (local_rank >= local_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_rank ", local_rank, " must be < local_size ", local_size));
  }
  for (const auto& [id, s] : sessions_) {
    if (s->local_rank == local_rank) {
      return absl::AlreadyExistsError(
          absl::StrCat("local_rank ", local_rank, " is held by session ", id, " (pid ", s->pid,
                       "); each trainer of a node needs its own local_rank"));
    }
  }
  auto session = std::make_unique<Session>();
  absl::BitGen gen;
  while (session->id == 0 || sessions_.count(session->id)) {
    session->id = absl::Uniform<uint64_t>(gen);
  }
  session->local_rank = local_rank;
  session->pid = pid;
  session->uid = uid;
  session->client = client;
  session->opened = absl::Now();
  session->pidfd = OpenPidfd(pid);
  SPEX_LOG(INFO) << "session " << session->id << " opened: local_rank " << local_rank << " pid "
                 << pid << " uid " << uid << " (" << client << ")";
  Session* out = session.get();
  sessions_[session->id] = std::move(session);
  return out;
}

absl::Status SessionRegistry::Close(uint64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("no session ", id));
  SPEX_LOG(INFO) << "session " << id << " (local_rank " << it->second->local_rank << ") closed";
  if (it->second->pidfd >= 0) close(it->second->pidfd);
  sessions_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<Session*> SessionRegistry::Get(uint64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", id, "; call Hello first"));
  }
  return it->second.get();
}

absl::Status SessionRegistry::CheckOwner(uint64_t id, uint32_t uid, uint32_t pid) const {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", id, "; call Hello first"));
  }
  const Session& s = *it->second;
  if (s.uid != uid || s.pid != pid) {
    SPEX_LOG(WARNING) << "refused a request for session " << id << " (uid " << s.uid << " pid "
                      << s.pid << ") from uid " << uid << " pid " << pid;
    return absl::PermissionDeniedError(
        absl::StrCat("session ", id, " was not opened by this process (uid ", uid, ", pid ", pid,
                     "): a trainer uses only the session its own Hello opened"));
  }
  return absl::OkStatus();
}

std::vector<SessionSummary> SessionRegistry::Summaries(absl::Time now) const {
  std::vector<SessionSummary> out;
  for (const auto& [id, s] : sessions_) {
    out.push_back({id, s->local_rank, s->pid, s->client, s->buckets,
                   absl::ToDoubleSeconds(now - s->opened), s->uid});
  }
  return out;
}

}  // namespace spex
