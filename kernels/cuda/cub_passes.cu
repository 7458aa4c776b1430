// The primitives cub already has: threshold count and moments (DeviceReduce::TransformReduce),
// threshold and top-k selection of indices (DeviceSelect::If over a counting iterator, which
// keeps indices ascending), and the prefix sum that ranks top-k ties (DeviceScan).
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>

#include "kernels/cuda/kernels.h"

namespace spex {
namespace gpu {
namespace {

struct SumU64 {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
    return a + b;
  }
};

struct AtLeastOne {
  float t;
  __device__ unsigned long long operator()(float v) const { return AbsAtLeast(v, t) ? 1ull : 0ull; }
};

struct MomentsOfOp {
  float lower_bound;
  __device__ MomentsAcc operator()(float v) const { return MomentsOf(v, lower_bound); }
};

struct MomentsCombineOp {
  __device__ MomentsAcc operator()(const MomentsAcc& a, const MomentsAcc& b) const {
    return MomentsCombine(a, b);
  }
};

struct AboveThreshold {
  const float* x;
  float t;
  __device__ bool operator()(uint32_t i) const { return AbsAtLeast(x[i], t); }
};

struct InTopK {
  const float* x;
  uint32_t threshold;
  const uint32_t* rank;  // exclusive prefix count of ties, or null when every tie is taken
  uint64_t take;
  __device__ bool operator()(uint32_t i) const {
    const uint32_t key = MagnitudeKey(x[i]);
    if (key != threshold) return key > threshold;
    return rank == nullptr || rank[i] < take;
  }
};

}  // namespace

cudaError_t CountAbove(void* temp, size_t* temp_bytes, const float* x, size_t n, float t,
                       unsigned long long* out, cudaStream_t stream) {
  return cub::DeviceReduce::TransformReduce(temp, *temp_bytes, x, out, n, SumU64{}, AtLeastOne{t},
                                            0ull, stream);
}

cudaError_t SelectAbove(void* temp, size_t* temp_bytes, const float* x, size_t begin, size_t end,
                        float t, uint32_t* out, int64_t* num_selected, cudaStream_t stream) {
  return cub::DeviceSelect::If(
      temp, *temp_bytes, thrust::counting_iterator<uint32_t>(static_cast<uint32_t>(begin)), out,
      num_selected, static_cast<int64_t>(end - begin), AboveThreshold{x, t}, stream);
}

cudaError_t ReduceMoments(void* temp, size_t* temp_bytes, const float* x, size_t n,
                          float lower_bound, MomentsAcc* out, cudaStream_t stream) {
  return cub::DeviceReduce::TransformReduce(temp, *temp_bytes, x, out, n, MomentsCombineOp{},
                                            MomentsOfOp{lower_bound}, MomentsZero(), stream);
}

cudaError_t ExclusiveSum(void* temp, size_t* temp_bytes, uint32_t* data, size_t n,
                         cudaStream_t stream) {
  return cub::DeviceScan::ExclusiveSum(temp, *temp_bytes, data, n, stream);
}

cudaError_t SelectTopK(void* temp, size_t* temp_bytes, const float* x, size_t n, uint32_t threshold,
                       const uint32_t* rank, uint64_t take, uint32_t* out, int64_t* num_selected,
                       cudaStream_t stream) {
  return cub::DeviceSelect::If(temp, *temp_bytes, thrust::counting_iterator<uint32_t>(0u), out,
                               num_selected, static_cast<int64_t>(n),
                               InTopK{x, threshold, rank, take}, stream);
}

}  // namespace gpu
}  // namespace spex
