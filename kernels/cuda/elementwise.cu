// Grid-stride kernels for the elementwise, indexed and histogram primitives (see kernels.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/grid.h"
#include "kernels/cuda/kernels.h"

namespace spex {
namespace gpu {
namespace {

__global__ void AccumulateKernel(float* __restrict__ y, const float* __restrict__ x, size_t n) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) y[i] += x[i];
}

__global__ void Accumulate4Kernel(float4* __restrict__ y, const float4* __restrict__ x, size_t n4) {
  for (size_t i = ThreadIndex(); i < n4; i += GridStride()) {
    float4 a = y[i];
    const float4 b = x[i];
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
    y[i] = a;
  }
}

__global__ void ScaleKernel(float* __restrict__ x, float a, size_t n) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) x[i] *= a;
}

__global__ void Scale4Kernel(float4* __restrict__ x, float a, size_t n4) {
  for (size_t i = ThreadIndex(); i < n4; i += GridStride()) {
    float4 v = x[i];
    v.x *= a;
    v.y *= a;
    v.z *= a;
    v.w *= a;
    x[i] = v;
  }
}

__global__ void SampleKernel(const float* __restrict__ x, size_t n, size_t m, uint64_t seed,
                             float* __restrict__ out) {
  for (size_t j = ThreadIndex(); j < m; j += GridStride()) {
    out[j] = n ? x[SampleIndex(SampleRandom(seed, j), n)] : 0.0f;
  }
}

__global__ void FirstBadIndexKernel(const uint32_t* __restrict__ idx, size_t m, uint64_t n,
                                    unsigned long long* first_bad) {
  for (size_t j = ThreadIndex(); j < m; j += GridStride()) {
    if (idx[j] >= n) atomicMin(first_bad, static_cast<unsigned long long>(j));
  }
}

__global__ void FirstNonfiniteKernel(const float* __restrict__ y, size_t n,
                                     unsigned long long* first_bad) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) {
    if (!isfinite(y[i])) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

__global__ void ScatterAddKernel(float* y, const uint32_t* __restrict__ idx,
                                 const float* __restrict__ val, size_t m) {
  for (size_t j = ThreadIndex(); j < m; j += GridStride()) atomicAdd(&y[idx[j]], val[j]);
}

__global__ void GatherKernel(const float* __restrict__ x, const uint32_t* __restrict__ idx,
                             size_t m, float* __restrict__ out) {
  for (size_t j = ThreadIndex(); j < m; j += GridStride()) out[j] = x[idx[j]];
}

__global__ void FillKernel(float* __restrict__ x, float v, size_t n) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) x[i] = v;
}

__global__ void ZeroAtKernel(float* x, const uint32_t* __restrict__ idx, size_t m) {
  for (size_t j = ThreadIndex(); j < m; j += GridStride()) x[idx[j]] = 0.0f;
}

// Lanes of a warp that hit the same bin add once, by their lowest lane: gradients crowd into a
// few exponents, so this cuts atomic traffic on the hot bins by up to 32x.
template <typename Count>
__device__ __forceinline__ void WarpAggregatedIncrement(Count* bins, uint32_t bin) {
  const unsigned same = __match_any_sync(__activemask(), bin);
  if (static_cast<int>(threadIdx.x & 31) == __ffs(same) - 1) {
    atomicAdd(&bins[bin], static_cast<Count>(__popc(same)));
  }
}

__global__ void AbsHistogram16Kernel(const float* __restrict__ x, size_t begin, size_t end,
                                     uint32_t* bins) {
  for (size_t i = begin + ThreadIndex(); i < end; i += GridStride()) {
    WarpAggregatedIncrement(bins, AbsBin16(x[i]));
  }
}

__global__ void HighDigitKernel(const float* __restrict__ x, size_t n, unsigned long long* counts) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) {
    WarpAggregatedIncrement(counts, MagnitudeKey(x[i]) >> 16);
  }
}

__global__ void LowDigitKernel(const float* __restrict__ x, size_t n, uint32_t high,
                               unsigned long long* counts) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) {
    const uint32_t key = MagnitudeKey(x[i]);
    if ((key >> 16) == high) WarpAggregatedIncrement(counts, key & 0xffffu);
  }
}

__global__ void PickDigitKernel(const unsigned long long* __restrict__ counts, uint64_t above,
                                uint64_t k, DigitPick* out) {
  __shared__ unsigned long long partial[kPickChunks];
  for (uint32_t c = threadIdx.x; c < kPickChunks; c += blockDim.x) {
    unsigned long long s = 0;
    for (uint32_t d = c * kPickBins; d < (c + 1) * kPickBins; ++d) s += counts[d];
    partial[c] = s;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  uint64_t seen = 0, total = 0;
  const uint32_t c = PickChunk(partial, above, k, &seen, &total);
  DigitPick p;
  p.total = total;
  if (c < kPickChunks) p = PickInChunk(counts, c, seen, k, total);
  *out = p;
}

__global__ void EmitSelectedKernel(float* x, const uint32_t* sel, size_t m, bool zero,
                                   uint32_t* idx, float* __restrict__ val) {
  for (size_t j = ThreadIndex(); j < m; j += GridStride()) {
    const uint32_t i = sel[j];
    idx[j] = i;
    val[j] = x[i];
    if (zero) x[i] = 0.0f;
  }
}

__global__ void TieFlagsKernel(const float* __restrict__ x, size_t n, uint32_t key,
                               uint32_t* __restrict__ flags) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) flags[i] = MagnitudeKey(x[i]) == key;
}

bool Aligned16(const void* a, const void* b) {
  return ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15) == 0;
}

}  // namespace

cudaError_t CheckKernelImage() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, AccumulateKernel);
}

cudaError_t LaunchAccumulate(const Launch& l, float* y, const float* x, size_t n) {
  if (n == 0) return cudaSuccess;
  if (Aligned16(y, x) && n >= 4) {
    const size_t n4 = n / 4;
    Accumulate4Kernel<<<Blocks(l, n4), kBlock, 0, l.stream>>>(
        reinterpret_cast<float4*>(y), reinterpret_cast<const float4*>(x), n4);
    if (n4 * 4 < n) AccumulateKernel<<<1, 32, 0, l.stream>>>(y + n4 * 4, x + n4 * 4, n - n4 * 4);
  } else {
    AccumulateKernel<<<Blocks(l, n), kBlock, 0, l.stream>>>(y, x, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchScale(const Launch& l, float* x, float a, size_t n) {
  if (n == 0) return cudaSuccess;
  if (Aligned16(x, x) && n >= 4) {
    const size_t n4 = n / 4;
    Scale4Kernel<<<Blocks(l, n4), kBlock, 0, l.stream>>>(reinterpret_cast<float4*>(x), a, n4);
    if (n4 * 4 < n) ScaleKernel<<<1, 32, 0, l.stream>>>(x + n4 * 4, a, n - n4 * 4);
  } else {
    ScaleKernel<<<Blocks(l, n), kBlock, 0, l.stream>>>(x, a, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSample(const Launch& l, const float* x, size_t n, size_t m, uint64_t seed,
                         float* out) {
  if (m == 0) return cudaSuccess;
  SampleKernel<<<Blocks(l, m), kBlock, 0, l.stream>>>(x, n, m, seed, out);
  return cudaGetLastError();
}

cudaError_t LaunchFirstBadIndex(const Launch& l, const uint32_t* idx, size_t m, uint64_t n,
                                unsigned long long* first_bad) {
  cudaError_t e = cudaMemsetAsync(first_bad, 0xff, sizeof(*first_bad), l.stream);
  if (e != cudaSuccess || m == 0) return e;
  FirstBadIndexKernel<<<Blocks(l, m), kBlock, 0, l.stream>>>(idx, m, n, first_bad);
  return cudaGetLastError();
}

cudaError_t LaunchFirstNonfinite(const Launch& l, const float* y, size_t n,
                                 unsigned long long* first_bad) {
  cudaError_t e = cudaMemsetAsync(first_bad, 0xff, sizeof(*first_bad), l.stream);
  if (e != cudaSuccess || n == 0) return e;
  FirstNonfiniteKernel<<<Blocks(l, n), kBlock, 0, l.stream>>>(y, n, first_bad);
  return cudaGetLastError();
}

cudaError_t LaunchScatterAdd(const Launch& l, float* y, const uint32_t* idx, const float* val,
                             size_t m) {
  if (m == 0) return cudaSuccess;
  ScatterAddKernel<<<Blocks(l, m), kBlock, 0, l.stream>>>(y, idx, val, m);
  return cudaGetLastError();
}

cudaError_t LaunchGather(const Launch& l, const float* x, const uint32_t* idx, size_t m,
                         float* out) {
  if (m == 0) return cudaSuccess;
  GatherKernel<<<Blocks(l, m), kBlock, 0, l.stream>>>(x, idx, m, out);
  return cudaGetLastError();
}

cudaError_t LaunchFill(const Launch& l, float* x, float v, size_t n) {
  if (n == 0) return cudaSuccess;
  FillKernel<<<Blocks(l, n), kBlock, 0, l.stream>>>(x, v, n);
  return cudaGetLastError();
}

cudaError_t LaunchZeroAt(const Launch& l, float* x, const uint32_t* idx, size_t m) {
  if (m == 0) return cudaSuccess;
  ZeroAtKernel<<<Blocks(l, m), kBlock, 0, l.stream>>>(x, idx, m);
  return cudaGetLastError();
}

cudaError_t LaunchAbsHistogram16(const Launch& l, const float* x, size_t begin, size_t end,
                                 uint32_t* bins) {
  if (end <= begin) return cudaSuccess;
  AbsHistogram16Kernel<<<Blocks(l, end - begin), kBlock, 0, l.stream>>>(x, begin, end, bins);
  return cudaGetLastError();
}

cudaError_t LaunchKeyHistogram(const Launch& l, const float* x, size_t n, bool low, uint32_t high,
                               unsigned long long* counts) {
  cudaError_t e = cudaMemsetAsync(counts, 0, 65536 * sizeof(*counts), l.stream);
  if (e != cudaSuccess || n == 0) return e;
  if (low) {
    LowDigitKernel<<<Blocks(l, n), kBlock, 0, l.stream>>>(x, n, high, counts);
  } else {
    HighDigitKernel<<<Blocks(l, n), kBlock, 0, l.stream>>>(x, n, counts);
  }
  return cudaGetLastError();
}

cudaError_t LaunchPickDigit(const Launch& l, const unsigned long long* counts, uint64_t above,
                            uint64_t k, DigitPick* out) {
  PickDigitKernel<<<1, kPickChunks, 0, l.stream>>>(counts, above, k, out);
  return cudaGetLastError();
}

cudaError_t LaunchEmitSelected(const Launch& l, float* x, const uint32_t* sel, size_t m, bool zero,
                               uint32_t* idx, float* val) {
  if (m == 0) return cudaSuccess;
  EmitSelectedKernel<<<Blocks(l, m), kBlock, 0, l.stream>>>(x, sel, m, zero, idx, val);
  return cudaGetLastError();
}

cudaError_t LaunchTieFlags(const Launch& l, const float* x, size_t n, uint32_t key,
                           uint32_t* flags) {
  if (n == 0) return cudaSuccess;
  TieFlagsKernel<<<Blocks(l, n), kBlock, 0, l.stream>>>(x, n, key, flags);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace spex
