// Exact top-k by magnitude for any Primitives on host memory, in about one pass over the data:
// a strided sample picks a threshold that at least k entries should reach, one threshold select
// collects those candidates, and only the candidates are ranked (histogram, then nth_element
// inside the boundary bin). When the sample misjudges, a full 2^16-bin histogram of |x| finds the
// exact boundary bin instead; the result is exact either way.
// Tie-heavy inputs (a constant, all zeros, few distinct values: issue 12) never copy or rank the
// ties: when many samples share the sampled key, one count checks that it is the k-th key, and
// the first k entries at or above it (one select, stopping its writes at k) plus the higher ones
// after them are the result; a boundary bin of the histogram path holding more than n/16 entries
// is resolved by a histogram of its low key bits instead of being copied out.
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

// The sampled threshold path alone (tied sampled key included). Returns false when the threshold
// let through fewer than k entries or more than n/4, the tied key was not the k-th, or k is too
// large a fraction of n for sampling to pay; idx and val may then have been written to.
bool SampledTopK(Primitives& p, const float* x, size_t n, size_t k, uint32_t* idx, float* val,
                 size_t* written);

// The full-histogram path alone (two passes: histogram, then the select).
size_t HistogramTopK(Primitives& p, const float* x, size_t n, size_t k, uint32_t* idx, float* val);

// One std::nth_element over all n indices.
size_t SmallTopK(const float* x, size_t n, size_t k, uint32_t* idx, float* val);

}  // namespace spex
