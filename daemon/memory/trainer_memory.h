// A trainer's own memory as its input slot (zero-copy input, CPU path): instead of copying each
// step's gradients into its slot of the bucket's segment, a trainer whose bucket already lives in
// shared memory (PyTorch's share_memory_() moves a tensor's storage into an unlinked /dev/shm
// file in place; a memfd does as well) names that file's descriptor and the bucket's offset at
// registration, and the daemon maps those bytes read-only and sums from them. The descriptor is
// taken from the trainer's process through its pidfd (pidfd_getfd, Linux >= 5.6: root, or a
// daemon allowed to ptrace the trainer), else by opening /proc/<pid>/fd/<fd> (the trainer's own
// user or root); the file must be a regular file owned by the trainer's user and hold the
// bucket. The mapping is guarded (segment_guard.h) like the daemon's own segments: a trainer
// that shrinks its file fails the bucket's next step instead of killing spexd.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "daemon/memory/segment_guard.h"

namespace spex {

// What a trainer names (RegisterBucketRequest.own_input): a descriptor in its own process and
// the byte offset of the bucket's first element in that file.
struct TrainerInputSpec {
  int64_t fd = -1;
  uint64_t offset = 0;
};

class TrainerMemory {
 public:
  // Maps `bytes` bytes at spec.offset of descriptor spec.fd of process `pid` (user `uid`;
  // `pidfd` its pidfd or -1) read-only. Errors name what to fix: INVALID_ARGUMENT for a
  // descriptor that is not a shared-memory file of the trainer's user or too small,
  // FAILED_PRECONDITION when this daemon may not take the descriptor (another user's daemon
  // without the right to ptrace the trainer), with the trainer's fallback (copy into the slot).
  static absl::StatusOr<std::unique_ptr<TrainerMemory>> Map(int pidfd, uint32_t pid, uint32_t uid,
                                                            const TrainerInputSpec& spec,
                                                            uint64_t bytes);
  ~TrainerMemory();
  TrainerMemory(const TrainerMemory&) = delete;
  TrainerMemory& operator=(const TrainerMemory&) = delete;

  const void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  // The file and offset, to tell a repeated registration naming the same memory from another.
  bool Same(const TrainerMemory& other) const {
    return dev_ == other.dev_ && ino_ == other.ino_ && offset_ == other.offset_;
  }
  // Set once the trainer shrank its file under the daemon (the range then reads as zeros).
  const std::atomic<bool>* pulled_flag() const { return guard_->flag(); }

 private:
  TrainerMemory(void* base, size_t length, const void* data, uint64_t bytes, dev_t dev, ino_t ino,
                uint64_t offset);
  void* base_;
  size_t length_;
  const void* data_;
  uint64_t bytes_;
  dev_t dev_;
  ino_t ino_;
  uint64_t offset_;
  std::unique_ptr<SegmentGuard> guard_;  // released before the range is unmapped
};

}  // namespace spex
