// Threshold control shared by MiCRO and ExDyna (docs/algorithms.md#threshold-control):
//  - reference: the published multiplicative controller on K_prev / k (1.005 above 1.1x,
//    1.00125 inside the band, 0.995 at or below 1/1.1x), th0 = 1 / (2 sqrt(k));
//  - histogram: a 2^16-bin |acc| histogram of the owned range, walked from the top to the bin
//    where the count reaches the quota; everything >= that bin's lower edge is selected in a
//    second pass (at least the quota, over by at most that bin's population). With `trim` (spex's
//    default) the candidates are cut to the exact top-quota, so the count meets the quota exactly
//    whenever the range holds that many non-zero entries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/compressor.h"
#include "kernels/compressors/state_blob.h"
#include "kernels/primitives.h"

namespace spex {

enum class ThresholdControl { kReference, kHistogram };

inline constexpr double kRefUpFactor = 1.005;       // ratio > 1.1: too many selected
inline constexpr double kRefCreepFactor = 1.00125;  // 1/1.1 < ratio <= 1.1 (the in-band creep)
inline constexpr double kRefDownFactor = 0.995;     // ratio <= 1/1.1: too few
inline constexpr double kRefBand = 1.1;

// The published scale factor for ratio = K_prev / k.
double ReferenceScaleFactor(double ratio);
// 1 / (2 sqrt(k)), the hard-threshold heuristic of Sahu et al.
float InitialThreshold(size_t k);

// Quota of partition `part` when k is split evenly over `parts` (remainder to the first ones).
size_t EvenShare(size_t k, int parts, int part);

// HistogramQuotaSelect's `counted_from` when nothing was counted before it.
constexpr uint32_t kNotCounted = 0xFFFFFFFFu;

// Selects at least `quota` of the largest |acc| in [begin, end) (exactly `quota` with trim, or
// every non-zero entry when there are fewer), appending ascending indices to out. `bins` is
// host scratch for host primitives (resized to 2^16). Returns the threshold actually applied (the
// bin edge, or the smallest kept magnitude after trimming); +Inf when nothing is selected.
// `scratch`: see device_scratch.h (device primitives). On device primitives nothing that scales
// with the range comes back: the bins are walked on the device (Primitives::AbsHistogramEdge,
// 24 bytes back), the candidates are selected, cut to the quota and compacted there, and the
// kept pairs come out in one copy into pinned host staging (AppendAboveTopDevice): 8 bytes per
// selected entry.
//
// `edge_hint` (optional): the edge bin of this compressor's previous selection, updated here.
// With a hint the histogram first counts only the bins from a little below it (most entries
// are below and cost no increment: a compare-only pass); when those bins hold fewer than
// `quota` entries it counts once more from 256 bins (a factor 4 in magnitude) lower, and only
// when that falls short too is the full histogram taken. The selection is the same either way: it
// reads only the bins from its edge up, and those are counted exactly in both.
//
// `counted_from` (host primitives, at most 0xFF00): `bins` (kHistogramBins of them) already holds
// the histogram of [begin, end) from this bin on (the local sum counted it: SumHistogram), so the
// first count starts there and is only walked; a shortfall counts again as above.
float HistogramQuotaSelect(Primitives* p, const float* acc, size_t begin, size_t end, size_t quota,
                           bool trim, std::vector<uint32_t>* bins, Selection* out,
                           Scratch* scratch = nullptr, uint32_t* edge_hint = nullptr,
                           uint32_t counted_from = kNotCounted);

// The bin a count from `margin` bins below the hint starts at (0: all of them; no hint: 0).
// HistogramQuotaSelect's own first count uses 32 bins (a factor 2^(1/4) in magnitude).
uint32_t HistogramCountStart(const uint32_t* edge_hint, uint32_t margin);

// The controller state MiCRO and ExDyna carry between steps, for their checkpoints: the threshold
// (reference control), the previous step's gathered count and the histogram edge hint. Load
// reads into the outputs only when all three are present.
void SaveThresholdState(StateWriter* w, float th, uint64_t k_prev, uint32_t edge_hint);
bool LoadThresholdState(StateReader& r, float* th, uint64_t* k_prev, uint32_t* edge_hint);

}  // namespace spex
