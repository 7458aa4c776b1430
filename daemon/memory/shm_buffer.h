// POSIX shared memory for the CPU path: the daemon creates a segment with an unguessable name
// and mode 0600 (ShmBuffer), trainers map it by name (client/shm_mapping.h). The name is unlinked
// as soon as every trainer has attached, so a killed process leaks nothing in /dev/shm. The
// daemon's mapping is guarded (segment_guard.h): a trainer shrinking the segment fails its
// bucket instead of killing the daemon.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/memory/segment_guard.h"
#include "daemon/memory/shared_buffer.h"

namespace spex {

class ShmBuffer : public SharedBuffer {
 public:
  // Creates and maps `size` bytes (zero-filled, pages populated). `tag` goes into the name
  // ("/spex-<tag>-<random>") to make /dev/shm readable; it must be [A-Za-z0-9_.-]*.
  static absl::StatusOr<std::unique_ptr<ShmBuffer>> Create(size_t size, const std::string& tag);
  ~ShmBuffer() override;

  void* data() override { return base_; }
  size_t size() const override { return size_; }
  bool on_device() const override { return false; }
  void Describe(v1::BufferDescriptor* out) const override;
  absl::Status Unlink() override;

  const std::string& name() const { return name_; }
  bool unlinked() const { return unlinked_; }
  // Whether someone shrank the segment under the daemon (its memory now reads as zeros and
  // nothing written reaches the trainers); stays set.
  bool pulled() const { return guard_->pulled(); }
  const std::atomic<bool>* pulled_flag() const { return guard_->flag(); }

 private:
  ShmBuffer(std::string name, void* base, size_t size)
      : name_(std::move(name)),
        base_(base),
        size_(size),
        guard_(std::make_unique<SegmentGuard>(base, size)) {}
  std::string name_;
  void* base_;
  size_t size_;
  std::unique_ptr<SegmentGuard> guard_;  // released before the range is unmapped
  bool unlinked_ = false;
};

}  // namespace spex
