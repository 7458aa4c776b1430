// The threshold searches of DGC, RedSync, RedSync-trim and Gaussian-k as pure functions over a
// counting callback (count(t) = number of entries the threshold t selects), so tests can drive
// them with crafted counts. Constants and reasons: docs/algorithms.md#threshold-search.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

namespace spex {

using CountFn = std::function<size_t(float)>;

// Canonical DGC correction: up to `max_rounds` times, th *= 1.3 while count > 1.3 k and
// th *= 0.7 while count < 0.7 k; stops as soon as the count is inside [0.7 k, 1.3 k].
inline constexpr int kDgcMaxRounds = 10;
float DgcCorrect(float th, size_t k, const CountFn& count, int* rounds);

// RedSync: binary search of r in [0, 1] with th = mean + r (max - mean); stops when
// k < count < 2k or the interval is no wider than 0.2; count < k/2 moves the upper bound down,
// anything else the lower bound up (as documented for the reference). count is of |x| > th.
inline constexpr double kRedSyncEps = 0.2;
float RedSyncSearch(double mean, double max, size_t k, const CountFn& count, int* probes);

// RedSync-trim: r = 0.8, 0.6, ..., 0.0 until count >= k (th = mean + r (max - mean)).
float RedSyncTrimSearch(double mean, double max, size_t k, const CountFn& count, int* probes);

// Gaussian-k's published refinement (docs/algorithms.md#gaussiank, EC form): up to 3 times, th *=
// 0.5 when count < 2k/3 and th *= 1.5 when count > 4k/3, stopping at the first count inside;
// returns the threshold after the last step (not probed again when the 3 steps ran out).
inline constexpr int kGaussianKRounds = 3;
float GaussianKRefine(float th, size_t k, const CountFn& count, int* rounds);

// The published RedSync and Gaussian-k loops stop after a fixed number of probes whether or not
// the count reached the band they aim at; on heavy-tailed magnitudes (a few huge entries make
// max - mean, RedSync's search range, hundreds of times the distance from mean to the k-th
// magnitude; Gaussian fits miss the tail) they end far outside it. The band searches below run
// the published probes first, so they return the published threshold whenever it lands inside
// the band, and otherwise keep bisecting between the closest thresholds seen on either side.

// Counts for searches from bounds: the searches in this file only compare counts with a few cut
// points (count >= cut), so a count is answered from `bounds` (*lo <= count <= *hi, e.g. a
// magnitude histogram's) whenever both bounds lie on the same side of every cut, and by `exact`
// otherwise. The answer is then the lower bound: every comparison with a cut comes out as with
// the exact count, but the value itself is not exact (it only matters where BisectToBand, finding
// no count inside its band, ranks its probes by count).
using BoundsFn = std::function<void(float t, size_t* lo, size_t* hi)>;
CountFn CutCount(BoundsFn bounds, std::vector<double> cuts, CountFn exact);
// The cut points of RedSyncSearch and RedSyncBandSearch (k/2, k + 1, 2k), RedSyncTrimSearch (k)
// and GaussianKRefine and GaussianKBandRefine (2k/3, floor(4k/3) + 1).
std::vector<double> RedSyncCuts(size_t k);
std::vector<double> RedSyncTrimCuts(size_t k);
std::vector<double> GaussianKCuts(size_t k);

// Inclusive count band [lo, hi] (may be empty when lo > hi: nothing can land inside).
struct CountBand {
  size_t lo, hi;
  bool Contains(size_t c) const { return c >= lo && c <= hi; }
};
// The bands the published loops aim at: RedSync k < count < 2k, Gaussian-k [2k/3, 4k/3].
CountBand RedSyncBand(size_t k);
CountBand GaussianKBand(size_t k);

// One probe of a search: a threshold and the count it selects.
struct Probe {
  float th;
  size_t count;
};

// Bisects the threshold between the highest probe with too many and the lowest with too few
// (initial brackets: `many` and `few`, taken as too many and too few without probing) until a
// probe's count is inside `band`, no float lies strictly between the brackets, or `probes` holds
// `max_probes`. Midpoints are arithmetic (RedSync's th is linear in its search variable r) or
// geometric. Every probe is appended to `probes` (which may hold earlier ones, used as brackets).
// Returns the threshold of a probe inside the band, or else of the probe nearest to it (ratio of
// counts; an empty count is farthest).
float BisectToBand(float many, float few, CountBand band, bool geometric, int max_probes,
                   const CountFn& count, std::vector<Probe>* probes);

// RedSync with its band reached: the published search (RedSyncSearch); if its last probe is
// outside k < count < 2k, bisection of th in [mean, max] continues (up to kBandMaxProbes probes
// in all). `probes` counts them.
inline constexpr int kBandMaxProbes = 40;
float RedSyncBandSearch(double mean, double max, size_t k, const CountFn& count, int* probes);

// Gaussian-k with its band reached: the published refinement (GaussianKRefine); if its final
// threshold selects outside [2k/3, 4k/3], geometric bisection continues between the thresholds
// seen on either side (initially kMinThreshold-like `floor` and `max`, the largest magnitude), up
// to kBandMaxProbes probes in all. `rounds` counts the probes after the first.
float GaussianKBandRefine(float th, size_t k, float floor, float max, const CountFn& count,
                          int* rounds);

}  // namespace spex
