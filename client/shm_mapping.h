// A trainer's mapping of a POSIX shm segment the daemon created and described
// (spex.v1.ShmDescriptor: name and size; the daemon's side is daemon/memory/shm_buffer.h). The
// name is unlinked once every local trainer has attached, so a late trainer cannot attach.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace spex {

// A trainer's mapping of a segment the daemon created.
class ShmMapping {
 public:
  // Opens `name` and maps exactly `size` bytes; fails if the segment is smaller.
  static absl::StatusOr<std::unique_ptr<ShmMapping>> Attach(const std::string& name, size_t size);
  ~ShmMapping();
  void* data() { return base_; }
  size_t size() const { return size_; }

 private:
  ShmMapping(void* base, size_t size) : base_(base), size_(size) {}
  void* base_;
  size_t size_;
};

}  // namespace spex
