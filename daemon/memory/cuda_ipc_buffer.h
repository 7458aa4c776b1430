// CUDA IPC shared buffers (the GPU path of the SharedBuffer seam, docs/design.md#device). The
// daemon allocates a bucket's device memory once per registration (CudaIpcBuffer), exports it with
// cudaIpcGetMemHandle and one interprocess event per slot (for ordering writes against reads across
// processes); a trainer opens the handles once and keeps them in an IpcHandleCache, so no
// cudaIpcOpenMemHandle is paid per step. The descriptor codec (spex.v1.CudaIpcDescriptor <-> handle
// bytes, with size checks) and the cache logic are plain C++, tested without a GPU; the CUDA calls
// exist only under --config=cuda (elsewhere they return FailedPrecondition "built without CUDA").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/memory/layout.h"
#include "daemon/memory/shared_buffer.h"

namespace spex {

namespace v1 {
class CudaIpcDescriptor;
}

// Bytes in a cudaIpcMemHandle_t / cudaIpcEventHandle_t (CUDA_IPC_HANDLE_SIZE).
inline constexpr size_t kCudaIpcHandleBytes = 64;
// One event per input slot plus the output.
inline constexpr size_t kMaxIpcEvents = kMaxLocalTrainers + 1;

using IpcHandle = std::array<uint8_t, kCudaIpcHandleBytes>;

// The layout of a device bucket's data is DeviceInputOffset / DeviceOutputOffset /
// DeviceBucketBytes (layout.h). The IPC events of such a buffer are one per input slot (event
// r: trainer r's input is written) and then one for the output (event `slots`: the daemon's
// result is written).

// What a trainer needs to open a buffer, as plain values.
struct CudaIpcHandles {
  IpcHandle memory{};
  std::vector<IpcHandle> events;  // one per slot
  uint64_t size = 0;              // bytes
  int32_t device = 0;             // the daemon's GPU ordinal
};

void EncodeCudaIpcDescriptor(const CudaIpcHandles& handles, v1::CudaIpcDescriptor* out);
// InvalidArgument naming the field when a handle is not kCudaIpcHandleBytes long, the memory
// handle is all zeros, there are no events or more than kMaxIpcEvents, size is 0, or the
// device ordinal is negative.
absl::StatusOr<CudaIpcHandles> DecodeCudaIpcDescriptor(const v1::CudaIpcDescriptor& d);

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
