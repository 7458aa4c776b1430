#include "kernels/compressors/threshold_control.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/compressors/device_scratch.h"
#include "kernels/compressors/selection.h"

namespace spex {

double ReferenceScaleFactor(double ratio) {
  if (ratio > kRefBand) return kRefUpFactor;
  if (ratio > 1.0 / kRefBand) return kRefCreepFactor;
  return kRefDownFactor;
}

float InitialThreshold(size_t k) {
  return static_cast<float>(1.0 / (2.0 * std::sqrt(static_cast<double>(std::max<size_t>(k, 1)))));
}

size_t EvenShare(size_t k, int parts, int part) {
  const size_t q = k / parts, r = k % parts;
  return q + (static_cast<size_t>(part) < r ? 1 : 0);
}

float HistogramQuotaSelect(Primitives* p, const float* acc, size_t begin, size_t end, size_t quota,
                           bool trim, std::vector<uint32_t>* bins, Selection* out,
                           Scratch* scratch) {
  constexpr float kNone = std::numeric_limits<float>::infinity();
  if (quota == 0 || end <= begin) return kNone;
  bins->assign(Primitives::kHistogramBins, 0);
  (void)HistogramToHost(p, acc, begin, end, 0, bins->data(), scratch);  // a failure: in scratch
  // Bins above 0xFF00 (+Inf's bin) hold NaNs, which are never selected; bin 0 holds zeros (and
  // the tiniest denormals), which are never worth sending.
  constexpr uint32_t kTop = 0xFF00;
  uint64_t cum = 0;
  uint32_t b = kTop;
  for (; b >= 1; --b) {
    cum += (*bins)[b];
    if (cum >= quota) break;
  }
  if (b == 0) b = 1;  // fewer non-zero entries than the quota: take them all
  if (cum == 0) return kNone;
  const uint32_t bits = b << 15;
  float edge;
  std::memcpy(&edge, &bits, sizeof(edge));
  const size_t from = out->idx.size();
  // The select's count is known: cum entries are >= edge (casting away const is safe: zero=false).
  AppendAbove(p, const_cast<float*>(acc), nullptr, begin, end, edge, false, cum, out, scratch);
  if (!trim || out->idx.size() - from <= quota) return edge;
  TrimTopK(p, out, from, quota, scratch);
  float t = kNone;
  for (size_t j = from; j < out->val.size(); ++j) t = std::min(t, std::fabs(out->val[j]));
  return t;
}

}  // namespace spex
