// CudaIpcBuffer (cuda_ipc_buffer.h): a bucket's device memory and events, exported once per
// registration so trainers open them by handle; compiled only under --config=cuda.
#include "daemon/memory/cuda_ipc_buffer.h"

#include <algorithm>
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

std::string HandleKey(const IpcHandle& h) {
  return std::string(reinterpret_cast<const char*>(h.data()), h.size());
}

absl::StatusOr<IpcHandle> HandleFromBytes(const std::string& bytes, const std::string& field) {
  if (bytes.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC descriptor: ", field, " has ",
                                                   bytes.size(), " bytes; a CUDA IPC ",
                                                   "handle has ", kCudaIpcHandleBytes));
  }
  IpcHandle h;
  std::memcpy(h.data(), bytes.data(), h.size());
  return h;
}

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

void EncodeCudaIpcDescriptor(const CudaIpcHandles& handles, v1::CudaIpcDescriptor* out) {
  out->Clear();
  out->set_mem_handle(HandleKey(handles.memory));
  for (const IpcHandle& e : handles.events) out->add_event_handles(HandleKey(e));
  out->set_size(handles.size);
  out->set_device_ordinal(handles.device);
}

absl::StatusOr<CudaIpcHandles> DecodeCudaIpcDescriptor(const v1::CudaIpcDescriptor& d) {
  CudaIpcHandles h;
  absl::StatusOr<IpcHandle> memory = HandleFromBytes(d.mem_handle(), "mem_handle");
  if (!memory.ok()) return memory.status();
  if (std::all_of(memory->begin(), memory->end(), [](uint8_t b) { return b == 0; })) {
    return absl::InvalidArgumentError(
        "CUDA IPC descriptor: mem_handle is all zeros (not one cudaIpcGetMemHandle filled)");
  }
  h.memory = *memory;
  if (d.event_handles_size() == 0 || d.event_handles_size() > static_cast<int>(kMaxIpcEvents)) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC descriptor: ", d.event_handles_size(),
                                                   " event handles; expected one per slot, 1 to ",
                                                   kMaxIpcEvents));
  }
  for (int i = 0; i < d.event_handles_size(); ++i) {
    absl::StatusOr<IpcHandle> e =
        HandleFromBytes(d.event_handles(i), absl::StrCat("event_handles[", i, "]"));
    if (!e.ok()) return e.status();
    h.events.push_back(*e);
  }
  if (d.size() == 0) return absl::InvalidArgumentError("CUDA IPC descriptor: size is 0");
  if (d.device_ordinal() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC descriptor: device_ordinal ", d.device_ordinal(), " is negative"));
  }
  h.size = d.size();
  h.device = d.device_ordinal();
  return h;
}

absl::StatusOr<std::unique_ptr<CudaIpcBuffer>> CudaIpcBuffer::Create(size_t size, int slots,
                                                                     int device) {
  if (size == 0) return absl::InvalidArgumentError("CUDA IPC buffer size must be > 0");
  if (slots < 1 || slots > static_cast<int>(kMaxIpcEvents)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC buffer: ", slots, " slots; must be 1 to ", kMaxIpcEvents));
  }
  if (device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC buffer: GPU ordinal ", device));
  }
#ifdef SPEX_HAVE_CUDA
  DeviceGuard guard(device);
  std::unique_ptr<CudaIpcBuffer> b(new CudaIpcBuffer());
  b->handles_.size = size;
  b->handles_.device = device;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaFailure(e, absl::StrCat("cudaSetDevice(", device, ")"));
  }
  if (cudaError_t e = cudaMalloc(&b->base_, size); e != cudaSuccess) {
    b->base_ = nullptr;
    return CudaFailure(e, absl::StrCat("cudaMalloc(", size, ")"));
  }
  if (cudaError_t e = cudaMemset(b->base_, 0, size); e != cudaSuccess) {
    return CudaFailure(e, "cudaMemset");
  }
  cudaIpcMemHandle_t mem;
  if (cudaError_t e = cudaIpcGetMemHandle(&mem, b->base_); e != cudaSuccess) {
    return CudaFailure(e, "cudaIpcGetMemHandle");
  }
  std::memcpy(b->handles_.memory.data(), &mem, sizeof(mem));
  for (int s = 0; s < slots; ++s) {
    cudaEvent_t event = nullptr;
    cudaError_t e =
        cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming);
    if (e != cudaSuccess) return CudaFailure(e, "cudaEventCreateWithFlags(interprocess)");
    b->events_.push_back(event);
    cudaIpcEventHandle_t eh;
    if (e = cudaIpcGetEventHandle(&eh, event); e != cudaSuccess) {
      return CudaFailure(e, "cudaIpcGetEventHandle");
    }
    IpcHandle bytes;
    std::memcpy(bytes.data(), &eh, sizeof(eh));
    b->handles_.events.push_back(bytes);
  }
  return b;
#else
  return NoCuda("CUDA IPC buffer");
#endif
}

CudaIpcBuffer::~CudaIpcBuffer() {
#ifdef SPEX_HAVE_CUDA
  DeviceGuard guard(handles_.device);
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (base_ != nullptr) cudaFree(base_);
#endif
}

void CudaIpcBuffer::Describe(v1::BufferDescriptor* out) const {
  EncodeCudaIpcDescriptor(handles_, out->mutable_cuda_ipc());
}

absl::Status CudaIpcBuffer::Unlink() {
  unlinked_ = true;
  return absl::OkStatus();
}

absl::Status CudaIpcBuffer::RecordSlot(int slot, void* stream) {
  if (slot < 0 || slot >= slots()) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " of ", slots()));
  }
#ifdef SPEX_HAVE_CUDA
  DeviceGuard guard(handles_.device);
  cudaError_t e =
      cudaEventRecord(static_cast<cudaEvent_t>(events_[slot]), static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) return CudaFailure(e, "cudaEventRecord");
  return absl::OkStatus();
#else
  return NoCuda("RecordSlot");
#endif
}

absl::Status CudaIpcBuffer::WaitSlot(int slot, void* stream) {
  if (slot < 0 || slot >= slots()) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " of ", slots()));
  }
#ifdef SPEX_HAVE_CUDA
  DeviceGuard guard(handles_.device);
  cudaError_t e = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                      static_cast<cudaEvent_t>(events_[slot]), 0);
  if (e != cudaSuccess) return CudaFailure(e, "cudaStreamWaitEvent");
  return absl::OkStatus();
#else
  return NoCuda("WaitSlot");
#endif
}

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
  const std::string key = HandleKey(handles->memory);

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
  auto it = open_.find(HandleKey(handles->memory));
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
