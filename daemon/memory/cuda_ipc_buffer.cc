// CudaIpcBuffer (cuda_ipc_buffer.h): a bucket's device memory and events, exported once per
// registration so trainers open them by handle; compiled only under --config=cuda.
#include "daemon/memory/cuda_ipc_buffer.h"

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

#ifdef SPEX_HAVE_CUDA
static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes);
static_assert(sizeof(cudaIpcEventHandle_t) == kCudaIpcHandleBytes);
#else
absl::Status NoCuda(const char* what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": spex was built without CUDA; rebuild with bazel build --config=cuda"));
}

#endif

}  // namespace

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

}  // namespace spex
