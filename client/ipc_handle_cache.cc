// The trainer's CUDA IPC handle cache (ipc_handle_cache.h): opens a device bucket's memory and
// events once per registration; the CUDA opener is compiled only under --config=cuda.
#include "client/ipc_handle_cache.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/spex.pb.h"

#ifdef SPEX_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/cuda_guard.h"
#endif

namespace spex {
namespace {

bool SameHandles(const CudaIpcHandles& a, const CudaIpcHandles& b) {
  return a.memory == b.memory && a.events == b.events && a.size == b.size && a.device == b.device;
}

#ifdef SPEX_HAVE_CUDA
static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes);
static_assert(sizeof(cudaIpcEventHandle_t) == kCudaIpcHandleBytes);

class CudaIpcOpener final : public IpcOpener {
 public:
  absl::StatusOr<void*> OpenMemory(const IpcHandle& handle, int device) override {
    DeviceGuard guard(device);
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* base = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) return CudaFailure(e, "cudaIpcOpenMemHandle");
    return base;
  }
  void CloseMemory(void* base, int device) override {
    DeviceGuard guard(device);
    cudaIpcCloseMemHandle(base);
  }
  absl::StatusOr<void*> OpenEvent(const IpcHandle& handle, int device) override {
    DeviceGuard guard(device);
    cudaIpcEventHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    cudaEvent_t event = nullptr;
    cudaError_t e = cudaIpcOpenEventHandle(&event, h);
    if (e != cudaSuccess) return CudaFailure(e, "cudaIpcOpenEventHandle");
    return static_cast<void*>(event);
  }
  void CloseEvent(void* event, int device) override {
    DeviceGuard guard(device);
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  absl::Status RecordEvent(void* event, void* stream, int device) override {
    DeviceGuard guard(device);
    cudaError_t e =
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) return CudaFailure(e, "cudaEventRecord(IPC event)");
    return absl::OkStatus();
  }
  absl::Status WaitEvent(void* event, void* stream, int device) override {
    DeviceGuard guard(device);
    cudaError_t e =
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0);
    if (e != cudaSuccess) return CudaFailure(e, "cudaStreamWaitEvent(IPC event)");
    return absl::OkStatus();
  }
};
#else
absl::Status NoCuda(const char* what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": spex was built without CUDA; rebuild with bazel build --config=cuda"));
}

class NoCudaOpener final : public IpcOpener {
 public:
  absl::StatusOr<void*> OpenMemory(const IpcHandle&, int) override {
    return NoCuda("cudaIpcOpenMemHandle");
  }
  void CloseMemory(void*, int) override {}
  absl::StatusOr<void*> OpenEvent(const IpcHandle&, int) override {
    return NoCuda("cudaIpcOpenEventHandle");
  }
  void CloseEvent(void*, int) override {}
};
#endif

}  // namespace

std::unique_ptr<IpcOpener> MakeCudaIpcOpener() {
#ifdef SPEX_HAVE_CUDA
  return std::make_unique<CudaIpcOpener>();
#else
  return std::make_unique<NoCudaOpener>();
#endif
}

absl::Status IpcOpener::RecordEvent(void*, void*, int) {
  return absl::UnimplementedError("this IpcOpener cannot record events");
}

absl::Status IpcOpener::WaitEvent(void*, void*, int) {
  return absl::UnimplementedError("this IpcOpener cannot wait for events");
}

IpcHandleCache::IpcHandleCache(std::unique_ptr<IpcOpener> opener) : opener_(std::move(opener)) {}

IpcHandleCache::~IpcHandleCache() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, entry] : open_) Close(entry.get());
}

void IpcHandleCache::Close(Entry* entry) {
  for (void* e : entry->mapping.events) opener_->CloseEvent(e, entry->mapping.device);
  entry->mapping.events.clear();
  if (entry->mapping.base != nullptr)
    opener_->CloseMemory(entry->mapping.base, entry->mapping.device);
  entry->mapping.base = nullptr;
}

absl::StatusOr<const IpcMapping*> IpcHandleCache::Attach(const v1::BufferDescriptor& descriptor) {
  if (!descriptor.has_cuda_ipc()) {
    return absl::InvalidArgumentError(
        "buffer descriptor is not CUDA IPC (a CPU-path daemon hands out POSIX shm buffers)");
  }
  absl::StatusOr<CudaIpcHandles> handles = DecodeCudaIpcDescriptor(descriptor.cuda_ipc());
  if (!handles.ok()) return handles.status();
  const std::string key = IpcHandleBytes(handles->memory);

  absl::MutexLock lock(&mu_);
  auto it = open_.find(key);
  if (it != open_.end()) {
    if (!SameHandles(it->second->handles, *handles)) {
      return absl::FailedPreconditionError(
          "CUDA IPC descriptor: this memory handle is already open with a different size, device "
          "or event list (a stale descriptor; re-register the bucket)");
    }
    return &it->second->mapping;
  }

  auto entry = std::make_unique<Entry>();
  entry->handles = *handles;
  entry->mapping.size = handles->size;
  entry->mapping.device = handles->device;
  absl::StatusOr<void*> base = opener_->OpenMemory(handles->memory, handles->device);
  if (!base.ok()) return base.status();
  entry->mapping.base = *base;
  for (const IpcHandle& e : handles->events) {
    absl::StatusOr<void*> event = opener_->OpenEvent(e, handles->device);
    if (!event.ok()) {
      Close(entry.get());
      return event.status();
    }
    entry->mapping.events.push_back(*event);
  }
  const IpcMapping* mapping = &entry->mapping;
  open_.emplace(key, std::move(entry));
  return mapping;
}

absl::Status IpcHandleCache::Release(const v1::BufferDescriptor& descriptor) {
  if (!descriptor.has_cuda_ipc()) {
    return absl::InvalidArgumentError("buffer descriptor is not CUDA IPC");
  }
  absl::StatusOr<CudaIpcHandles> handles = DecodeCudaIpcDescriptor(descriptor.cuda_ipc());
  if (!handles.ok()) return handles.status();
  absl::MutexLock lock(&mu_);
  auto it = open_.find(IpcHandleBytes(handles->memory));
  if (it == open_.end()) {
    return absl::NotFoundError("CUDA IPC buffer is not open in this process");
  }
  Close(it->second.get());
  open_.erase(it);
  return absl::OkStatus();
}

absl::Status IpcHandleCache::RecordEvent(const IpcMapping& mapping, int slot, void* stream) {
  if (slot < 0 || slot >= static_cast<int>(mapping.events.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("IPC event ", slot, " of a buffer with ", mapping.events.size()));
  }
  return opener_->RecordEvent(mapping.events[slot], stream, mapping.device);
}

absl::Status IpcHandleCache::WaitEvent(const IpcMapping& mapping, int slot, void* stream) {
  if (slot < 0 || slot >= static_cast<int>(mapping.events.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("IPC event ", slot, " of a buffer with ", mapping.events.size()));
  }
  return opener_->WaitEvent(mapping.events[slot], stream, mapping.device);
}

size_t IpcHandleCache::open_count() const {
  absl::MutexLock lock(&mu_);
  return open_.size();
}

}  // namespace spex
