// Small CUDA runtime helpers the daemon's GPU pieces share (CUDA IPC buffers, device memory,
// NCCL): selecting a GPU for the calling thread, and a cudaError_t as an absl::Status worded by
// ExplainCudaError. Only under --config=cuda (SPEX_HAVE_CUDA); empty otherwise.
#pragma once

#ifdef SPEX_HAVE_CUDA
#include <cuda_runtime.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_error.h"

namespace spex {

// FailedPrecondition "<what>: <explanation>", clearing the thread's sticky last error.
inline absl::Status CudaFailure(cudaError_t e, const std::string& what) {
  cudaGetLastError();
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": ", ExplainCudaError(cudaGetErrorName(e), cudaGetErrorString(e))));
}

// Selects `device` for the calling thread (the engine's, a gRPC handler's) and restores the
// previous one on destruction.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      restore_ = cudaSetDevice(device) == cudaSuccess;
    }
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

}  // namespace spex
#endif  // SPEX_HAVE_CUDA
