// A trainer's side of CUDA IPC device buckets: it opens the handles of a bucket's
// spex.v1.CudaIpcDescriptor (proto/contract/cuda_ipc_descriptor.h) once and keeps them in an
// IpcHandleCache, so no cudaIpcOpenMemHandle is paid per step; the daemon's side that exports
// them is daemon/memory/cuda_ipc_buffer.h. The cache logic is plain C++, tested with a fake
// opener; the CUDA calls exist only under --config=cuda (elsewhere every open returns
// FailedPrecondition "built without CUDA").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/contract/cuda_ipc_descriptor.h"

namespace spex {

namespace v1 {
class BufferDescriptor;
}

// A trainer's opened buffer: device pointer and the slots' events (cudaEvent_t).
struct IpcMapping {
  void* base = nullptr;
  uint64_t size = 0;
  int device = 0;
  std::vector<void*> events;
};

// The CUDA calls a trainer needs, behind an interface so the cache is tested with a fake.
class IpcOpener {
 public:
  virtual ~IpcOpener() = default;
  virtual absl::StatusOr<void*> OpenMemory(const IpcHandle& handle, int device) = 0;
  virtual void CloseMemory(void* base, int device) = 0;
  virtual absl::StatusOr<void*> OpenEvent(const IpcHandle& handle, int device) = 0;
  virtual void CloseEvent(void* event, int device) = 0;
  // Stream ordering through an opened event (cudaEventRecord / cudaStreamWaitEvent; `stream`
  // is a cudaStream_t, null = the legacy default stream). The defaults refuse: an opener that
  // only opens and closes (older fakes) cannot order work.
  virtual absl::Status RecordEvent(void* event, void* stream, int device);
  virtual absl::Status WaitEvent(void* event, void* stream, int device);
};

// cudaIpcOpenMemHandle (lazy peer access) / cudaIpcCloseMemHandle / cudaIpcOpenEventHandle /
// cudaEventDestroy; without CUDA every open fails with FailedPrecondition.
std::unique_ptr<IpcOpener> MakeCudaIpcOpener();

// Opened buffers keyed by their memory handle's bytes: each is opened once and reused every
// step until released. Thread-safe. Note that CUDA refuses to open a handle in the process
// that exported it, so the cache lives in trainers, not in the daemon.
class IpcHandleCache {
 public:
  explicit IpcHandleCache(std::unique_ptr<IpcOpener> opener);
  ~IpcHandleCache();  // closes everything still open
  IpcHandleCache(const IpcHandleCache&) = delete;
  IpcHandleCache& operator=(const IpcHandleCache&) = delete;

  // The mapping of the descriptor's buffer (must be the cuda_ipc kind), opened on first use.
  // A descriptor whose memory handle is cached with a different size, device or event list is
  // FailedPrecondition (a stale or forged descriptor); nothing is opened then.
  absl::StatusOr<const IpcMapping*> Attach(const v1::BufferDescriptor& descriptor);
  // Closes the buffer's mapping and events (e.g. after UnregisterBucket); NotFound when the
  // buffer is not open. Pointers from Attach for it become invalid.
  absl::Status Release(const v1::BufferDescriptor& descriptor);
  size_t open_count() const;
  // Records event `slot` of an attached mapping on `stream` (a trainer: "my input slot is
  // written"), or makes `stream` wait for it (a trainer: "the output is written" before it
  // reads). InvalidArgument for a slot outside the mapping's events.
  absl::Status RecordEvent(const IpcMapping& mapping, int slot, void* stream);
  absl::Status WaitEvent(const IpcMapping& mapping, int slot, void* stream);

 private:
  struct Entry {
    CudaIpcHandles handles;
    IpcMapping mapping;
  };
  void Close(Entry* entry);

  std::unique_ptr<IpcOpener> opener_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Entry>> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace spex
