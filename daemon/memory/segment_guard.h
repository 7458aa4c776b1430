// Shared segments that trainers can pull away. A trainer maps its bucket's POSIX shm segment
// read-write and can ftruncate it; the daemon's next access beyond the new end raises SIGBUS,
// which would kill spexd and, through mpirun, every node. (tmpfs files from shm_open cannot be
// sealed against shrinking; a sealed memfd would need its descriptor passed to every client.)
// Instead spexd registers each segment's mapping here: a SIGBUS inside a registered range is
// repaired by mapping private zero pages from the faulting page to the range's end (the faulting
// access then completes; what the file still holds stays shared) and recorded, so the bucket's next
// step fails with an error naming what happened (ReduceLocalChecked) and every other job goes on. A
// SIGBUS anywhere else keeps its default action (the process dies, as before).
#pragma once

#include <atomic>
#include <cstddef>

namespace spex {

class SegmentGuard {
 public:
  // Registers [base, base + size) (installing the SIGBUS handler on first use). The range stays
  // guarded until the guard is destroyed, which must happen before the range is unmapped.
  SegmentGuard(void* base, size_t size);
  ~SegmentGuard();
  SegmentGuard(const SegmentGuard&) = delete;
  SegmentGuard& operator=(const SegmentGuard&) = delete;

  // Whether the range faulted (it was shrunk under the daemon); stays set. Null flag when the
  // table was full (the range is then not guarded; logged).
  bool pulled() const { return flag_ != nullptr && flag_->load(std::memory_order_acquire); }
  // The flag itself, for code that sees the memory but not this object (BucketData).
  const std::atomic<bool>* flag() const { return flag_; }

  // Ranges repaired since the process started (tests, logs).
  static int repairs();

 private:
  int slot_ = -1;
  const std::atomic<bool>* flag_ = nullptr;
};

}  // namespace spex
