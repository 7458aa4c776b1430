// The shared-buffer seam (docs/design.md#seams): a region the daemon owns and trainers map.
// Implementations: POSIX shm (shm_buffer.h) and CUDA IPC (cuda_ipc_buffer.h). The daemon
// creates it once per registration and reuses it every step; the descriptor (proto
// spex.v1.BufferDescriptor) tells a trainer how to map it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace spex {

namespace v1 {
class BufferDescriptor;
}

class SharedBuffer {
 public:
  virtual ~SharedBuffer() = default;
  // Host-addressable base (CPU path) or device pointer (CUDA path).
  virtual void* data() = 0;
  virtual size_t size() const = 0;
  virtual bool on_device() const = 0;
  // Fills the descriptor a trainer needs to attach.
  virtual void Describe(v1::BufferDescriptor* out) const = 0;
  // Removes the name so nothing else can attach; the mapping stays valid. Idempotent.
  virtual absl::Status Unlink() = 0;
};

}  // namespace spex
