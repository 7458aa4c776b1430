// The trainer sessions of one node: who holds which local rank. A session is opened by Hello and
// closed by Goodbye; the registry checks the job name, the node's trainer count and that each
// local rank is held once. It watches each trainer's process through a pidfd (Linux >= 5.3), so
// a trainer that dies without Goodbye is noticed (Reap) and its local rank freed. A pid the
// daemon cannot see (0, or another PID namespace) is not watched. Not thread-safe: the engine
// calls it under its lock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/engine/exchange_record.h"

namespace spex {

struct Session {
  uint64_t id = 0;
  uint32_t local_rank = 0;
  uint32_t pid = 0;  // the trainer's process, as the kernel named the caller of Hello
  uint32_t uid = 0;  // its user, likewise
  std::string client;
  absl::Time opened;
  uint32_t buckets = 0;  // buckets this session registered
  uint64_t bytes = 0;    // their footprint (BucketTable::Footprint)
  int pidfd = -1;        // the trainer process (pidfd_open), -1 when it cannot be watched
};

class SessionRegistry {
 public:
  // `job` empty: any job name is accepted.
  SessionRegistry(int local_trainers, std::string job);

  // Checks the request (job, local_size against the node's trainer count, rank range, rank not
  // held) and opens a session with a random nonzero id.
  absl::StatusOr<Session*> Open(const std::string& job, uint32_t local_rank, uint32_t local_size,
                                uint32_t pid, const std::string& client, uint32_t uid = 0);
  // NOT_FOUND for an unknown id.
  absl::Status Close(uint64_t id);
  // NOT_FOUND ("call Hello first") for an unknown id.
  absl::StatusOr<Session*> Get(uint64_t id);
  // NOT_FOUND as Get, and PERMISSION_DENIED unless the session was opened by process `pid` of
  // user `uid` (the kernel's credentials of the caller): a session id is not a password.
  absl::Status CheckOwner(uint64_t id, uint32_t uid, uint32_t pid) const;

  // Closes and returns the sessions whose trainer process has exited.
  std::vector<Session> Reap();

  bool empty() const { return sessions_.empty(); }
  ~SessionRegistry();
  std::vector<SessionSummary> Summaries(absl::Time now) const;

 private:
  const int local_trainers_;
  const std::string job_;
  std::map<uint64_t, std::unique_ptr<Session>> sessions_;
};

}  // namespace spex
