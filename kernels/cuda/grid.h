// Grid-stride indexing and launch sizes shared by the .cu kernels (nvcc only: device code).
#pragma once

#if !defined(__CUDACC__)
#error "kernels/cuda/grid.h holds device code: include it from .cu files only"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "kernels/cuda/kernels.h"

namespace spex {
namespace gpu {

__device__ __forceinline__ size_t ThreadIndex() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t GridStride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

// Blocks of kBlock threads for `work` elements, at least 1 and at most l.max_blocks.
inline unsigned Blocks(const Launch& l, size_t work) {
  const size_t needed = (work + kBlock - 1) / kBlock;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(needed, l.max_blocks)));
}

}  // namespace gpu
}  // namespace spex
