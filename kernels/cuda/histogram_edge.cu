// The device-side histogram threshold (histogram_edge.h): count, then walk, on the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/histogram_edge.h"

namespace spex {
namespace gpu {
namespace {

constexpr int kEdgeBlock = 256;

// As elementwise.cu's histogram: one atomic per distinct bin per warp (gradients' magnitudes
// crowd into few bins), and only for the bins from `first` on.
__global__ void HistogramFromKernel(const float* __restrict__ x, size_t begin, size_t end,
                                    uint32_t first, uint32_t* bins) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = begin + static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < end;
       i += stride) {
    const uint32_t bin = AbsBin16(x[i]);
    if (bin < first) continue;
    const unsigned same = __match_any_sync(__activemask(), bin);
    if (static_cast<int>(threadIdx.x & 31) == __ffs(same) - 1) atomicAdd(&bins[bin], __popc(same));
  }
}

__global__ void EdgeKernel(const uint32_t* __restrict__ bins, uint32_t lo, uint64_t quota,
                           EdgePick* out) {
  __shared__ uint64_t partial[kEdgeChunks];
  for (uint32_t c = threadIdx.x; c < kEdgeChunks; c += blockDim.x) {
    partial[c] = EdgeChunkSum(bins, c, lo);
  }
  __syncthreads();
  if (threadIdx.x == 0) *out = EdgeFromBins(bins, partial, lo, quota);
}

}  // namespace

cudaError_t LaunchHistogramEdge(cudaStream_t stream, int max_blocks, const float* x, size_t begin,
                                size_t end, uint32_t first_bin, uint64_t quota, uint32_t* bins,
                                EdgePick* out) {
  cudaError_t e = cudaMemsetAsync(bins, 0, 65536 * sizeof(uint32_t), stream);
  if (e != cudaSuccess) return e;
  if (end > begin) {
    const size_t needed = (end - begin + kEdgeBlock - 1) / kEdgeBlock;
    const unsigned blocks =
        static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(needed, max_blocks)));
    HistogramFromKernel<<<blocks, kEdgeBlock, 0, stream>>>(x, begin, end, first_bin, bins);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  EdgeKernel<<<1, kEdgeChunks, 0, stream>>>(bins, EdgeLowBin(first_bin), quota, out);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace spex
