// The |acc| histogram with cumulative counts and its threshold queries (magnitude_histogram.h).
#include "kernels/compressors/magnitude_histogram.h"

#include <algorithm>
#include <cstring>

#include "kernels/compressors/device_scratch.h"

namespace spex {

namespace {
// Bin 0xFF00 holds +-Inf (and NaNs with a payload below 2^15); the bins above it only NaNs.
constexpr uint32_t kInfBin = 0xFF00;
}  // namespace

void MagnitudeHistogram::Build(Primitives* p, const float* acc, size_t n, Scratch* scratch) {
  BuildFrom(p, acc, n, 0.0f, scratch);
}

void MagnitudeHistogram::BuildFrom(Primitives* p, const float* acc, size_t n, float floor,
                                   Scratch* scratch) {
  uint32_t bits;
  std::memcpy(&bits, &floor, sizeof(bits));
  n_ = n;
  first_ = floor > 0 ? std::min(bits >> 15, kInfBin) : 0;  // NaN and <= 0: every bin
  missed_ = false;
  bins_.assign(Primitives::kHistogramBins, 0);
  (void)HistogramToHost(p, acc, 0, n, first_, bins_.data(), scratch);  // a failure: in scratch
  from_.assign(kInfBin + 1, 0);
  for (uint32_t b = kInfBin; b-- > first_;) from_[b] = from_[b + 1] + bins_[b];
  inf_bin_ = bins_[kInfBin];
}

void MagnitudeHistogram::Bounds(float t, size_t* lo, size_t* hi) const {
  uint32_t bits;
  std::memcpy(&bits, &t, sizeof(bits));
  const uint32_t b = bits >> 15;
  if (!(t > 0) || b >= kInfBin) {  // not a positive finite threshold: no bound worth having
    *lo = 0;
    *hi = n_;
    return;
  }
  if (b < first_) {  // below the counted bins: at least the entries in them
    missed_ = true;
    *lo = from_[first_];
    *hi = n_;
    return;
  }
  // Every entry in a higher finite bin is above t, none in a lower bin is; t's own bin and the
  // Inf bin (which may hold NaNs) are undecided.
  *lo = from_[b + 1];
  *hi = from_[b] + inf_bin_;
}

float MagnitudeHistogram::FloorOfTop(size_t k) const {
  if (k == 0 || from_[first_] < k) return 0;
  uint32_t b = kInfBin - 1;
  while (from_[b] < k) --b;  // stops at first_ at the latest
  const uint32_t bits = b << 15;
  float t;
  std::memcpy(&t, &bits, sizeof(t));
  return t;
}

}  // namespace spex
