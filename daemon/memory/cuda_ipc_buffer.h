// CUDA IPC shared buffers (the GPU path of the SharedBuffer seam, docs/design.md#device). The
// daemon allocates a bucket's device memory once per registration (CudaIpcBuffer), exports it with
// cudaIpcGetMemHandle and one interprocess event per slot (for ordering writes against reads across
// processes), and describes it with the contract's codec (proto/contract/cuda_ipc_descriptor.h);
// trainers open the handles through client/ipc_handle_cache.h. The CUDA calls exist only under
// --config=cuda (elsewhere they return FailedPrecondition "built without CUDA").
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/memory/shared_buffer.h"
#include "proto/contract/cuda_ipc_descriptor.h"

namespace spex {

namespace v1 {
class BufferDescriptor;
}

// The daemon side: device memory plus per-slot interprocess events.
class CudaIpcBuffer : public SharedBuffer {
 public:
  // Allocates `size` bytes (zeroed) on GPU `device` and `slots` events
  // (cudaEventInterprocess | cudaEventDisableTiming), and exports their handles.
  static absl::StatusOr<std::unique_ptr<CudaIpcBuffer>> Create(size_t size, int slots, int device);
  ~CudaIpcBuffer() override;

  void* data() override { return base_; }
  size_t size() const override { return handles_.size; }
  bool on_device() const override { return true; }
  void Describe(v1::BufferDescriptor* out) const override;
  // A CUDA IPC handle cannot be revoked; this only records that no new trainer should attach
  // (Describe still works). The memory lives until the daemon frees it and every trainer has
  // closed its mapping.
  absl::Status Unlink() override;

  // Records slot `slot`'s event on `stream` (a cudaStream_t; null = the legacy default
  // stream): work queued before it on that stream is what a waiter will see.
  absl::Status RecordSlot(int slot, void* stream);
  // Makes `stream` wait (on the GPU, without blocking the host) for the slot's last record.
  absl::Status WaitSlot(int slot, void* stream);

  const CudaIpcHandles& handles() const { return handles_; }
  int slots() const { return static_cast<int>(events_.size()); }
  bool unlinked() const { return unlinked_; }

 private:
  CudaIpcBuffer() = default;
  void* base_ = nullptr;
  std::vector<void*> events_;  // cudaEvent_t
  CudaIpcHandles handles_;
  bool unlinked_ = false;
};

}  // namespace spex
