// The threshold searches of DGC, RedSync, RedSync-trim and Gaussian-k over a counting callback
// (threshold_search.h).
#include "kernels/compressors/threshold_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace spex {

float DgcCorrect(float th, size_t k, const CountFn& count, int* rounds) {
  *rounds = 0;
  for (int r = 0; r < kDgcMaxRounds; ++r) {
    const double c = static_cast<double>(count(th));
    if (c > 1.3 * k) {
      th *= 1.3f;
    } else if (c < 0.7 * k) {
      th *= 0.7f;
    } else {
      break;
    }
    ++*rounds;
  }
  return th;
}

float RedSyncSearch(double mean, double max, size_t k, const CountFn& count, int* probes) {
  double lo = 0, hi = 1;
  float th = static_cast<float>(mean);  // the reference starts from 0.0; any probe overwrites it
  *probes = 0;
  while (hi - lo > kRedSyncEps) {
    const double mid = lo + (hi - lo) / 2;
    th = static_cast<float>(mean + mid * (max - mean));
    const size_t nnz = count(th);
    ++*probes;
    if (nnz > k && nnz < 2 * k) break;
    if (static_cast<double>(nnz) < k / 2.0) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return th;
}

float RedSyncTrimSearch(double mean, double max, size_t k, const CountFn& count, int* probes) {
  float th = static_cast<float>(mean);
  *probes = 0;
  for (int i = 4; i >= 0; --i) {
    th = static_cast<float>(mean + 0.2 * i * (max - mean));
    ++*probes;
    if (count(th) >= k) break;
  }
  return th;
}

float GaussianKRefine(float th, size_t k, const CountFn& count, int* rounds) {
  *rounds = 0;
  for (; *rounds < kGaussianKRounds; ++*rounds) {
    const double c = static_cast<double>(count(th));
    if (c < 2.0 * k / 3.0) {
      th *= 0.5f;
    } else if (c > 4.0 * k / 3.0) {
      th *= 1.5f;
    } else {
      break;
    }
  }
  return th;
}

CountFn CutCount(BoundsFn bounds, std::vector<double> cuts, CountFn exact) {
  return [bounds = std::move(bounds), cuts = std::move(cuts), exact = std::move(exact)](float t) {
    size_t lo, hi;
    bounds(t, &lo, &hi);
    for (double cut : cuts) {
      if (static_cast<double>(lo) < cut && static_cast<double>(hi) >= cut) return exact(t);
    }
    return lo;
  };
}

std::vector<double> RedSyncCuts(size_t k) { return {k / 2.0, static_cast<double>(k + 1), 2.0 * k}; }

std::vector<double> RedSyncTrimCuts(size_t k) { return {static_cast<double>(k)}; }

std::vector<double> GaussianKCuts(size_t k) {
  // floor(4k / 3) + 1: the integer division is meant.
  return {2.0 * k / 3.0, static_cast<double>(4 * k / 3 + 1)};  // NOLINT(bugprone-integer-division)
}

CountBand RedSyncBand(size_t k) { return {k + 1, 2 * k - 1}; }

CountBand GaussianKBand(size_t k) { return {(2 * k + 2) / 3, 4 * k / 3}; }

namespace {

// How far a count is from the band, as a ratio (1 inside; an empty count is farthest).
double Distance(size_t c, CountBand band) {
  if (c < band.lo) {
    return c == 0 ? std::numeric_limits<double>::infinity() : static_cast<double>(band.lo) / c;
  }
  if (c > band.hi) return static_cast<double>(c) / std::max<size_t>(band.hi, 1);
  return 1;
}

// A counting callback that also records every probe.
CountFn Recording(const CountFn& count, std::vector<Probe>* probes) {
  return [&count, probes](float t) {
    const size_t c = count(t);
    probes->push_back({t, c});
    return c;
  };
}

}  // namespace

float BisectToBand(float many, float few, CountBand band, bool geometric, int max_probes,
                   const CountFn& count, std::vector<Probe>* probes) {
  for (const Probe& p : *probes) {
    if (band.Contains(p.count)) return p.th;
    if (p.count > band.hi) {
      many = std::max(many, p.th);
    } else {
      few = std::min(few, p.th);
    }
  }
  while (probes->size() < static_cast<size_t>(max_probes)) {
    const double lo = many, hi = few;
    const float t = static_cast<float>(geometric ? std::sqrt(lo * hi) : lo + (hi - lo) / 2);
    if (!(t > many && t < few)) break;  // no float strictly between the brackets
    const size_t c = count(t);
    probes->push_back({t, c});
    if (band.Contains(c)) return t;
    if (c > band.hi) {
      many = t;
    } else {
      few = t;
    }
  }
  float best_th = few;
  double best = std::numeric_limits<double>::infinity();
  for (const Probe& p : *probes) {
    const double dist = Distance(p.count, band);
    if (dist < best) {
      best = dist;
      best_th = p.th;
    }
  }
  return best_th;
}

float RedSyncBandSearch(double mean, double max, size_t k, const CountFn& count, int* probes) {
  std::vector<Probe> seen;
  const float th = RedSyncSearch(mean, max, k, Recording(count, &seen), probes);
  const CountBand band = RedSyncBand(k);
  if (!seen.empty() && band.Contains(seen.back().count)) return th;
  const float found = BisectToBand(static_cast<float>(mean), static_cast<float>(max), band, false,
                                   kBandMaxProbes, count, &seen);
  *probes = static_cast<int>(seen.size());
  return found;
}

float GaussianKBandRefine(float th, size_t k, float floor, float max, const CountFn& count,
                          int* rounds) {
  std::vector<Probe> seen;
  th = GaussianKRefine(th, k, Recording(count, &seen), rounds);
  if (*rounds < kGaussianKRounds) return th;  // the published loop stopped inside the band
  const CountBand band = GaussianKBand(k);
  const size_t c = count(th);  // the published final threshold, not probed by the loop
  seen.push_back({th, c});
  if (!band.Contains(c)) th = BisectToBand(floor, max, band, true, kBandMaxProbes, count, &seen);
  *rounds = static_cast<int>(seen.size()) - 1;
  return th;
}

}  // namespace spex
