// What the engine needs to keep bucket data on a device (the GPU path, docs/design.md#device), as
// two small interfaces so that the engine's device path is the CPU path's code plus these calls,
// and is tested with a fake device (tests/support/fake_device.h) where no GPU exists:
//  - BufferAllocator: a bucket's data buffer (input slots and output, exported to trainers;
//    the BucketHeader with the doorbell counters stays in host shm) and engine-private device
//    memory (the node's accumulator);
//  - SlotOrdering: the per-step ordering of device work across processes, i.e. wait for every
//    trainer's input event before reading the inputs and record the output event after the
//    result is written (CudaIpcBuffer::WaitSlot / RecordSlot).
// The CUDA implementation is daemon/memory/cuda_device_memory.h. Data movement on the device
// (copies, fills, staging to and from host memory) goes through Primitives.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/memory/shared_buffer.h"
#include "kernels/primitives.h"

namespace spex {

// Device memory only the engine uses; freed with the object.
class DeviceArray {
 public:
  virtual ~DeviceArray() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;  // bytes
};

class BufferAllocator {
 public:
  virtual ~BufferAllocator() = default;
  // The device the memory is on (the engine checks that it matches its Primitives).
  virtual Device device() const = 0;
  // A bucket's data buffer of `bytes` bytes (DeviceBucketBytes(elements, slots, element size):
  // the input slots, then the output, 2 bytes an element for bfloat16/float16 buckets, 4 for
  // float32) with `events` ordering events (slots + 1: one per input slot, then the output),
  // zero-filled. Its Describe() is what trainers attach (a cuda_ipc descriptor).
  virtual absl::StatusOr<std::unique_ptr<SharedBuffer>> AllocateBucket(size_t bytes,
                                                                       int events) = 0;
  // `bytes` bytes of engine-private device memory, zero-filled.
  virtual absl::StatusOr<std::unique_ptr<DeviceArray>> AllocateScratch(size_t bytes) = 0;
};

class SlotOrdering {
 public:
  virtual ~SlotOrdering() = default;
  // Called once per local trainer and step, after the trainer signalled "ready" and before the
  // engine reads input slot `slot` of `bucket` (a buffer from the allocator): returns once the
  // trainer's device work queued before it recorded event `slot` is visible to the engine.
  virtual absl::Status WaitInput(SharedBuffer* bucket, int slot) = 0;
  // Called once per step after the engine wrote the output of `bucket` and before it publishes
  // the step: records event `slot` (= local trainers), which trainers wait for before reading.
  virtual absl::Status RecordOutput(SharedBuffer* bucket, int slot) = 0;
};

// Copies between the GPUs of one node (docs/design.md#multi-gpu): peer to peer where the two
// have peer access, else staged through pinned host memory. Each copy is complete on return.
class DeviceLink {
 public:
  virtual ~DeviceLink() = default;
  // `bytes` from `src` on GPU `src_device` to `dst` on GPU `dst_device` (both device memory of
  // those GPUs' allocators).
  virtual absl::Status Copy(int dst_device, void* dst, int src_device, const void* src,
                            size_t bytes) = 0;
  // Whether `from` reads and writes memory of `to` directly (a copy needs no host staging).
  virtual bool PeerAccess(int from, int to) const = 0;
};

// Another GPU of the node that trainers' buckets may live on.
struct NodeDevice {
  int ordinal = 0;
  BufferAllocator* allocator = nullptr;
  SlotOrdering* ordering = nullptr;
};

// The pieces of an engine that serves device buckets; everything is owned by the caller and
// outlives the engine. An engine without them (allocator == nullptr) is the CPU path.
struct DevicePath {
  BufferAllocator* allocator = nullptr;
  SlotOrdering* ordering = nullptr;
  // Host primitives for what must run in host memory: the sparse exchange's wire messages, and
  // the codecs of a test's codec_factory, fed through explicit staging copies (see
  // Engine::SparseStep). Every compressor runs on the device primitives (device scratch).
  Primitives* host_prims = nullptr;
  // Several GPUs (docs/design.md#multi-gpu): `allocator` and `ordering` above are the home
  // GPU's (ordinal `home`: the bucket data, the sum, the residual, the compressor); `others`
  // the node's other GPUs a trainer may register a bucket on, copied to and from through
  // `link`. Empty: every trainer's bucket is on the home GPU.
  int home = 0;
  std::vector<NodeDevice> others;
  DeviceLink* link = nullptr;
};

}  // namespace spex
