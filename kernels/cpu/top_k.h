// Exact top-k by magnitude for any Primitives on host memory, in about one pass over the data:
// a strided sample picks a threshold that at least k entries should reach, one threshold select
// collects those candidates, and only the candidates are ranked (histogram, then nth_element
// inside the boundary bin). When the sample misjudges, a full 2^16-bin histogram of |x| finds the
// exact boundary bin instead; the result is exact either way.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/primitives.h"

namespace spex {

// The sample: kTopKSampleBlocks runs of kTopKSampleRun consecutive entries, evenly spaced.
inline constexpr size_t kTopKSampleBlocks = 4096;
inline constexpr size_t kTopKSampleRun = 16;

// Primitives::TopK (same contract: ascending indices, ties toward the lower index, NaN after
// every number) built on p's AbsHistogram16, CountAbove and SelectAbove (with zero = false, so x
// is never written). Uses SmallTopK below 64K entries, then SampledTopK, then HistogramTopK.
size_t FastTopK(Primitives& p, const float* x, size_t n, size_t k, uint32_t* idx, float* val);

// The sampled threshold path alone. Returns false (and writes nothing) when the threshold let
// through fewer than k entries, or k is too large a fraction of n for sampling to pay.
bool SampledTopK(Primitives& p, const float* x, size_t n, size_t k, uint32_t* idx, float* val,
                 size_t* written);

// The full-histogram path alone (two passes: histogram, then the select).
size_t HistogramTopK(Primitives& p, const float* x, size_t n, size_t k, uint32_t* idx, float* val);

// One std::nth_element over all n indices.
size_t SmallTopK(const float* x, size_t n, size_t k, uint32_t* idx, float* val);

}  // namespace spex
