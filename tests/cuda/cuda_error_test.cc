// The wording of CUDA errors shown to operators (kernels/cuda/cuda_error.h).
#include "kernels/cuda/cuda_error.h"

#include "gtest/gtest.h"

namespace spex {
namespace {

TEST(ExplainCudaError, NamesTheCauseAndKeepsTheRuntimeText) {
  EXPECT_EQ(ExplainCudaError("cudaErrorInsufficientDriver",
                             "CUDA driver version is insufficient for CUDA runtime version"),
            "no NVIDIA driver (or one older than the CUDA runtime): cudaErrorInsufficientDriver "
            "(CUDA driver version is insufficient for CUDA runtime version)");
  EXPECT_EQ(ExplainCudaError("cudaErrorNoDevice", "no CUDA-capable device is detected"),
            "no CUDA-capable device: cudaErrorNoDevice (no CUDA-capable device is detected)");
  EXPECT_NE(ExplainCudaError("cudaErrorNoKernelImageForDevice", "x").find("architecture"),
            std::string::npos);
}

TEST(ExplainCudaError, UnknownErrorsStillCarryNameAndText) {
  EXPECT_EQ(ExplainCudaError("cudaErrorLaunchFailure", "unspecified launch failure"),
            "CUDA error: cudaErrorLaunchFailure (unspecified launch failure)");
}

}  // namespace
}  // namespace spex
