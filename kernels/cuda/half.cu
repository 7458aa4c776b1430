// Grid-stride kernels for bfloat16/float16 buckets (see kernels.h): the widen-and-sum of the
// local reduce, narrowing and widening. Each thread does one element at a time with
// half_math.h's integer conversions (bit-identical to kernels/half.h) and explicitly rounded
// float32 adds and multiplies (__fadd_rn, __fmul_rn: never contracted into an FMA), in the order
// of the CPU pass, so results equal the CPU path's bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/grid.h"
#include "kernels/cuda/half_math.h"
#include "kernels/cuda/kernels.h"

namespace spex {
namespace gpu {
namespace {

template <bool kBf16>
__global__ void SumWidenHalfKernel(float* y, const float* acc, HalfInputs in, bool scale, float a,
                                   size_t n) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) {
    int r = 0;
    float s;
    if (acc != nullptr) {
      s = acc[i];
    } else {
      s = WidenHalf(kBf16, in.x[0][i]);
      r = 1;
    }
    for (; r < in.count; ++r) s = __fadd_rn(s, WidenHalf(kBf16, in.x[r][i]));
    y[i] = scale ? __fmul_rn(s, a) : s;
  }
}

template <bool kBf16>
__global__ void NarrowHalfKernel(const float* __restrict__ x, uint16_t* __restrict__ y, size_t n) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) y[i] = NarrowHalf(kBf16, x[i]);
}

template <bool kBf16>
__global__ void WidenHalfKernel(const uint16_t* __restrict__ x, float* __restrict__ y, size_t n) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) y[i] = WidenHalf(kBf16, x[i]);
}

}  // namespace

cudaError_t LaunchSumWidenHalf(const Launch& l, bool bf16, float* y, const float* acc,
                               const HalfInputs& in, bool scale, float a, size_t n) {
  if (n == 0) return cudaSuccess;
  if (in.count < 1 || in.count > kMaxHalfInputs) return cudaErrorInvalidValue;
  if (bf16) {
    SumWidenHalfKernel<true><<<Blocks(l, n), kBlock, 0, l.stream>>>(y, acc, in, scale, a, n);
  } else {
    SumWidenHalfKernel<false><<<Blocks(l, n), kBlock, 0, l.stream>>>(y, acc, in, scale, a, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchNarrowHalf(const Launch& l, bool bf16, const float* x, uint16_t* y, size_t n) {
  if (n == 0) return cudaSuccess;
  if (bf16) {
    NarrowHalfKernel<true><<<Blocks(l, n), kBlock, 0, l.stream>>>(x, y, n);
  } else {
    NarrowHalfKernel<false><<<Blocks(l, n), kBlock, 0, l.stream>>>(x, y, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchWidenHalf(const Launch& l, bool bf16, const uint16_t* x, float* y, size_t n) {
  if (n == 0) return cudaSuccess;
  if (bf16) {
    WidenHalfKernel<true><<<Blocks(l, n), kBlock, 0, l.stream>>>(x, y, n);
  } else {
    WidenHalfKernel<false><<<Blocks(l, n), kBlock, 0, l.stream>>>(x, y, n);
  }
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace spex
