// The device side of the CUDA primitives: kernel launchers (elementwise.cu) and cub-backed
// passes (cub_passes.cu), one function per data pass. No policy lives here: argument checks,
// scratch memory, synchronisation and error messages are in cuda_primitives.cc, and the
// per-element math in device_math.h. All pointers are device memory; calls are asynchronous
// on the given stream and return the launch's error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/device_math.h"

namespace spex {
namespace gpu {

// Grid-stride kernels use blocks of kBlock threads, at most max_blocks of them.
inline constexpr int kBlock = 256;
struct Launch {
  cudaStream_t stream = nullptr;
  int max_blocks = 1024;
};

// cudaSuccess when the current device can run this binary's kernels, else the error
// (cudaErrorNoKernelImageForDevice for an architecture the build did not target).
cudaError_t CheckKernelImage();

cudaError_t LaunchAccumulate(const Launch& l, float* y, const float* x, size_t n);
cudaError_t LaunchScale(const Launch& l, float* x, float a, size_t n);
cudaError_t LaunchSample(const Launch& l, const float* x, size_t n, size_t m, uint64_t seed,
                         float* out);
// *first_bad = the lowest i < n with y[i] NaN or +-Inf, or ~0 when there is none.
cudaError_t LaunchFirstNonfinite(const Launch& l, const float* y, size_t n,
                                 unsigned long long* first_bad);
// *first_bad = the lowest j < m with idx[j] >= n, or ~0 when there is none.
cudaError_t LaunchFirstBadIndex(const Launch& l, const uint32_t* idx, size_t m, uint64_t n,
                                unsigned long long* first_bad);
cudaError_t LaunchScatterAdd(const Launch& l, float* y, const uint32_t* idx, const float* val,
                             size_t m);
cudaError_t LaunchGather(const Launch& l, const float* x, const uint32_t* idx, size_t m,
                         float* out);
cudaError_t LaunchZeroAt(const Launch& l, float* x, const uint32_t* idx, size_t m);
// x[i] = v for i < n.
cudaError_t LaunchFill(const Launch& l, float* x, float v, size_t n);
// bins[AbsBin16(x[i])] += 1 for i in [begin, end).
cudaError_t LaunchAbsHistogram16(const Launch& l, const float* x, size_t begin, size_t end,
                                 uint32_t* bins);
// counts (kDigitBins entries) = histogram of MagnitudeKey(x[i]) >> 16, or, with `low`, of the
// low 16 bits among the keys whose high 16 bits equal `high`. Clears counts first.
cudaError_t LaunchKeyHistogram(const Launch& l, const float* x, size_t n, bool low, uint32_t high,
                               unsigned long long* counts);
// The radix top-k's digit choice on the device (device_math.h PickChunk/PickInChunk) from the
// 2^16 `counts` of LaunchKeyHistogram: one block, writes the DigitPick to `out` (device memory).
cudaError_t LaunchPickDigit(const Launch& l, const unsigned long long* counts, uint64_t above,
                            uint64_t k, DigitPick* out);
// For j < m: i = sel[j]; idx[j] = i; val[j] = x[i]; then x[i] = 0 when `zero`. sel may be idx.
cudaError_t LaunchEmitSelected(const Launch& l, float* x, const uint32_t* sel, size_t m, bool zero,
                               uint32_t* idx, float* val);
// flags[i] = MagnitudeKey(x[i]) == key ? 1 : 0.
cudaError_t LaunchTieFlags(const Launch& l, const float* x, size_t n, uint32_t key,
                           uint32_t* flags);

// Half-precision buckets (half.cu; the conversions are half_math.h's). `bf16`: the values are
// bfloat16, else float16.
// The most half inputs one LaunchSumWidenHalf takes (a node's local trainers).
inline constexpr int kMaxHalfInputs = 32;
struct HalfInputs {
  const uint16_t* x[kMaxHalfInputs];
  int count;  // 1 .. kMaxHalfInputs
};
// y[i] = a * (acc[i] + widen(x[0][i]) + ... + widen(x[count-1][i])), left to right in float32
// (acc null: the sum starts at x[0]; scale false: no multiply); y may equal acc.
cudaError_t LaunchSumWidenHalf(const Launch& l, bool bf16, float* y, const float* acc,
                               const HalfInputs& in, bool scale, float a, size_t n);
// y[i] = x[i] rounded to the half type.
cudaError_t LaunchNarrowHalf(const Launch& l, bool bf16, const float* x, uint16_t* y, size_t n);
// y[i] = widen(x[i]).
cudaError_t LaunchWidenHalf(const Launch& l, bool bf16, const uint16_t* x, float* y, size_t n);

// cub-backed passes. With temp == nullptr they only set *temp_bytes (cub's two-phase use).
cudaError_t CountAbove(void* temp, size_t* temp_bytes, const float* x, size_t n, float t,
                       unsigned long long* out, cudaStream_t stream);
// out = the i in [begin, end) with |x[i]| >= t, ascending; *num_selected = their number.
// `out` must hold end - begin entries.
cudaError_t SelectAbove(void* temp, size_t* temp_bytes, const float* x, size_t begin, size_t end,
                        float t, uint32_t* out, int64_t* num_selected, cudaStream_t stream);
cudaError_t ReduceMoments(void* temp, size_t* temp_bytes, const float* x, size_t n,
                          float lower_bound, MomentsAcc* out, cudaStream_t stream);
// In-place exclusive prefix sum of n uint32 values.
cudaError_t ExclusiveSum(void* temp, size_t* temp_bytes, uint32_t* data, size_t n,
                         cudaStream_t stream);
// out = the i in [0, n) with key > threshold, or key == threshold and (rank == nullptr or
// rank[i] < take), ascending (key = MagnitudeKey(x[i])).
cudaError_t SelectTopK(void* temp, size_t* temp_bytes, const float* x, size_t n, uint32_t threshold,
                       const uint32_t* rank, uint64_t take, uint32_t* out, int64_t* num_selected,
                       cudaStream_t stream);

}  // namespace gpu
}  // namespace spex
