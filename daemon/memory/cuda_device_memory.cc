// The CUDA device memory of the engine (cuda_device_memory.h): bucket data in IPC-exported
// buffers, accumulators and scratch on the daemon's GPU; compiled only under --config=cuda.
#include "daemon/memory/cuda_device_memory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/memory/cuda_ipc_buffer.h"

#ifdef SPEX_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/cuda_guard.h"
#endif

namespace spex {

#ifdef SPEX_HAVE_CUDA
namespace {

class CudaScratch final : public DeviceArray {
 public:
  CudaScratch(void* ptr, size_t bytes, int device) : ptr_(ptr), bytes_(bytes), device_(device) {}
  ~CudaScratch() override {
    DeviceGuard guard(device_);
    cudaFree(ptr_);
  }
  void* data() override { return ptr_; }
  size_t size() const override { return bytes_; }

 private:
  void* ptr_;
  size_t bytes_;
  int device_;
};

class CudaDeviceMemoryImpl final : public CudaDeviceMemory {
 public:
  explicit CudaDeviceMemoryImpl(int device) : device_(device) {}
  ~CudaDeviceMemoryImpl() override {
    DeviceGuard guard(device_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    DeviceGuard guard(device_);
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaFailure(e, absl::StrCat("cudaSetDevice(", device_, ")"));
    }
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
        e != cudaSuccess) {
      stream_ = nullptr;
      return CudaFailure(e, "cudaStreamCreate (slot ordering)");
    }
    return absl::OkStatus();
  }

  int gpu() const override { return device_; }
  Device device() const override { return Device::kCuda; }

  absl::StatusOr<std::unique_ptr<SharedBuffer>> AllocateBucket(size_t bytes, int events) override {
    absl::StatusOr<std::unique_ptr<CudaIpcBuffer>> b =
        CudaIpcBuffer::Create(bytes, events, device_);
    if (!b.ok()) return b.status();
    return std::unique_ptr<SharedBuffer>(std::move(*b));
  }

  absl::StatusOr<std::unique_ptr<DeviceArray>> AllocateScratch(size_t bytes) override {
    DeviceGuard guard(device_);
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
      return CudaFailure(e, absl::StrCat("cudaMalloc(", bytes, ") for the engine's accumulator"));
    }
    auto scratch = std::make_unique<CudaScratch>(p, bytes, device_);
    if (cudaError_t e = cudaMemset(p, 0, bytes); e != cudaSuccess) {
      return CudaFailure(e, "cudaMemset (engine accumulator)");
    }
    return std::unique_ptr<DeviceArray>(std::move(scratch));
  }

  absl::Status WaitInput(SharedBuffer* bucket, int slot) override {
    CudaIpcBuffer* b = Ipc(bucket);
    if (b == nullptr) return NotIpc("WaitInput");
    if (absl::Status s = b->WaitSlot(slot, stream_); !s.ok()) return s;
    DeviceGuard guard(device_);
    if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
      return CudaFailure(e, absl::StrCat("waiting for trainer ", slot, "'s input event"));
    }
    return absl::OkStatus();
  }

  absl::Status RecordOutput(SharedBuffer* bucket, int slot) override {
    CudaIpcBuffer* b = Ipc(bucket);
    if (b == nullptr) return NotIpc("RecordOutput");
    return b->RecordSlot(slot, stream_);
  }

 private:
  static CudaIpcBuffer* Ipc(SharedBuffer* bucket) { return dynamic_cast<CudaIpcBuffer*>(bucket); }
  static absl::Status NotIpc(const char* what) {
    return absl::InternalError(
        absl::StrCat(what, ": the bucket's buffer is not a CUDA IPC buffer of this allocator"));
  }

  const int device_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> CudaDeviceMemory::Create(int device) {
  if (device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device memory: GPU ordinal ", device));
  }
  auto m = std::make_unique<CudaDeviceMemoryImpl>(device);
  if (absl::Status s = m->Init(); !s.ok()) return s;
  return std::unique_ptr<CudaDeviceMemory>(std::move(m));
}

#else  // !SPEX_HAVE_CUDA

absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> CudaDeviceMemory::Create(int device) {
  return absl::FailedPreconditionError(
      absl::StrCat("CUDA device memory on GPU ", device,
                   ": spex was built without CUDA; rebuild with bazel build --config=cuda"));
}

#endif  // SPEX_HAVE_CUDA

}  // namespace spex
