// Single-threaded SIMD loops behind the CPU primitives, compiled for every x86 target Highway
// knows (SSSE3 ... AVX-512) and dispatched at run time to the best one the CPU supports.
// cpu_primitives.cc splits large ranges across threads and calls these on each piece.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/primitives.h"

namespace spex {
namespace simd {

void Accumulate(float* y, const float* x, size_t n);
void Scale(float* x, float a, size_t n);
// y = a * (xs[0] + ... + xs[count-1]) summed left to right; a == 1 skips the multiply.
// `stream`: y is written with non-temporal stores (for a y far larger than the caches: no
// read-for-ownership of y's lines); the same values either way.
void SumScaled(float* y, const float* const* xs, int count, float a, size_t n, bool stream = false);
// SumScaled that returns the lowest i whose result y[i] is NaN or +-Inf (n when none), found
// in the same pass (the same values as SumScaled).
size_t SumScaledCheckFinite(float* y, const float* const* xs, int count, float a, size_t n,
                            bool stream = false);
// SumScaledCheckFinite that also adds the |y| histogram of all n entries written to `bins`, as
// Histogram16From(y, n, first, bins) would after it (bins >= first exactly, the others not).
size_t SumScaledCheckFiniteHistogram(float* y, const float* const* xs, int count, float a, size_t n,
                                     bool stream, uint32_t first, uint32_t* bins);
size_t CountAbove(const float* x, size_t n, float t);

// As Primitives::SelectAbove on [begin, end) (writes at most `capacity`, returns the count).
size_t Select(float* x, size_t begin, size_t end, float t, bool zero, uint32_t* idx, float* val,
              size_t capacity);
// As Primitives::AddSelectAbove: acc += add and the select in one pass.
size_t AddSelect(float* acc, const float* add, size_t begin, size_t end, float t, bool zero,
                 uint32_t* idx, float* val, size_t capacity);

// Primitives::Moments over x[0..n).
AbsMoments Moments(const float* x, size_t n, float lower_bound);

// Primitives::AccumulateMoments over acc[0..n).
AbsMoments FusedMoments(float* acc, const float* add, size_t n, float lower_bound, bool logs);
// Histogram16 counting only the entries whose bin is >= first.
void Histogram16From(const float* x, size_t n, uint32_t first, uint32_t* bins);

// Primitives::AbsHistogram16 over x[0..n): bins[(bits of x[i] & 0x7fffffff) >> 15] += 1.
void Histogram16(const float* x, size_t n, uint32_t* bins);

// Largest of idx[0..m) (0 when m == 0).
uint32_t MaxIndex(const uint32_t* idx, size_t m);

// Name of the Highway target the dispatcher picked for this CPU (e.g. "AVX3", "AVX2").
const char* TargetName();

}  // namespace simd
}  // namespace spex
