// Exact top-k by magnitude in two passes over the data, for any Primitives on host memory: a
// 2^16-bin magnitude histogram finds the bin holding the k-th largest |x|, a threshold select
// collects everything from that bin up, and only that bin's candidates are ordered exactly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/primitives.h"

namespace spex {

// Primitives::TopK (same contract, ties toward the lower index, NaN last) computed with p's
// AbsHistogram16, CountAbove and SelectAbove (the latter with zero = false: x is not written).
size_t HistogramTopK(Primitives& p, const float* x, size_t n, size_t k, uint32_t* idx, float* val);

// The same result by one std::nth_element over all n indices; used for small n.
size_t SmallTopK(const float* x, size_t n, size_t k, uint32_t* idx, float* val);

}  // namespace spex
