// The CUDA implementation of the engine's device memory (device_memory.h) on one GPU: bucket
// data in CudaIpcBuffers (cudaMalloc'd, exported with cudaIpcGetMemHandle, one interprocess
// event per input slot plus one for the output), engine scratch from cudaMalloc, and the slot
// ordering on a stream of its own: WaitInput makes that stream wait for the trainer's event and
// synchronises it (the engine's device calls all complete before they return, so a host-side
// wait is the ordering they need); RecordOutput records the output event once the engine's
// writes are complete. Without --config=cuda, Create fails with "built without CUDA".
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/memory/device_memory.h"

namespace spex {

class CudaDeviceMemory : public BufferAllocator, public SlotOrdering {
 public:
  // On GPU `device`. FailedPrecondition (saying why) where CUDA is not built in or the GPU
  // cannot be used.
  static absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> Create(int device);
  virtual int gpu() const = 0;
};

}  // namespace spex
