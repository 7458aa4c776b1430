// The threshold searches of DGC, RedSync and RedSync-trim as pure functions over a counting
// callback (count(t) = number of entries the threshold t selects), so tests can drive them with
// crafted counts. Constants from ALGORITHMS.md 7.9 and 7.10 and decisions item 4.
#pragma once

#include <cstddef>
#include <functional>

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

}  // namespace spex
