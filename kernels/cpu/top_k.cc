#include "kernels/cpu/top_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace spex {
namespace {

constexpr uint32_t kInfKey = 0x7f800000u;  // magnitude bits of +Inf; larger keys are NaN
constexpr uint32_t kInfBin = kInfKey >> 15;

inline uint32_t MagnitudeKey(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u & 0x7fffffffu;
}

inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// k >= number of non-NaN entries: every number, then the first NaNs by index.
size_t TakeAllNumbers(const float* x, size_t n, size_t k, size_t numbers, uint32_t* idx,
                      float* val) {
  size_t nan_left = k - numbers, w = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) {
      if (nan_left == 0) continue;
      --nan_left;
    }
    idx[w] = static_cast<uint32_t>(i);
    val[w] = x[i];
    ++w;
  }
  return w;
}

}  // namespace

size_t SmallTopK(const float* x, size_t n, size_t k, uint32_t* idx, float* val) {
  k = std::min(k, n);
  if (k == 0) return 0;
  // Order: larger key first, NaN (key -1) after every number, then lower index.
  auto key = [&](uint32_t i) -> int64_t {
    const uint32_t u = MagnitudeKey(x[i]);
    return u > kInfKey ? -1 : static_cast<int64_t>(u);
  };
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  auto better = [&](uint32_t a, uint32_t b) {
    const int64_t ka = key(a), kb = key(b);
    return ka != kb ? ka > kb : a < b;
  };
  if (k < n) std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), better);
  order.resize(k);
  std::sort(order.begin(), order.end());
  for (size_t j = 0; j < k; ++j) {
    idx[j] = order[j];
    val[j] = x[order[j]];
  }
  return k;
}

size_t HistogramTopK(Primitives& p, const float* x, size_t n, size_t k, uint32_t* idx, float* val) {
  k = std::min(k, n);
  if (k == 0) return 0;
  std::vector<uint32_t> hist(Primitives::kHistogramBins, 0);
  p.AbsHistogram16(x, 0, n, hist.data());

  // Bin kInfBin holds +Inf and the NaNs with small payloads; all bins above it are NaN.
  const size_t infs =
      hist[kInfBin] ? p.CountAbove(x, n, std::numeric_limits<float>::infinity()) : 0;
  size_t numbers = infs;
  for (uint32_t b = 0; b < kInfBin; ++b) numbers += hist[b];
  if (k >= numbers) return TakeAllNumbers(x, n, k, numbers, idx, val);

  // The boundary bin: fewer than k numbers lie above it, at least k from it up.
  size_t above = 0;
  uint32_t bin = kInfBin;
  for (;; --bin) {
    const size_t here = bin == kInfBin ? infs : hist[bin];
    if (above + here >= k) break;
    above += here;
  }
  const size_t in_bin = bin == kInfBin ? infs : hist[bin];

  // Everything with |x| >= the bin's lowest magnitude: exactly above + in_bin numbers.
  const size_t candidates = above + in_bin;
  std::vector<uint32_t> cidx(candidates);
  std::vector<float> cval(candidates);
  const size_t got = p.SelectAbove(const_cast<float*>(x), 0, n, FromBits(bin << 15),
                                   /*zero=*/false, cidx.data(), cval.data(), candidates);
  (void)got;  // == candidates: the histogram counted exactly these entries

  // The k-th largest key inside the boundary bin, and how many of its ties to take.
  const uint32_t bin_floor = bin << 15;
  const uint32_t bin_ceil = bin == kInfBin ? kInfKey : ((bin + 1) << 15) - 1;
  std::vector<uint32_t> keys;
  keys.reserve(in_bin);
  for (size_t j = 0; j < candidates; ++j) {
    const uint32_t u = MagnitudeKey(cval[j]);
    if (u >= bin_floor && u <= bin_ceil) keys.push_back(u);
  }
  const size_t need = k - above;  // 1 <= need <= keys.size()
  std::nth_element(keys.begin(), keys.begin() + (need - 1), keys.end(), std::greater<uint32_t>());
  const uint32_t kth = keys[need - 1];
  size_t greater = 0;
  for (uint32_t u : keys) greater += u > kth;
  size_t ties_left = need - greater;

  size_t w = 0;
  for (size_t j = 0; j < candidates; ++j) {
    const uint32_t u = MagnitudeKey(cval[j]);
    if (u < kth) continue;
    if (u == kth) {
      if (ties_left == 0) continue;
      --ties_left;
    }
    idx[w] = cidx[j];
    val[w] = cval[j];
    ++w;
  }
  return w;
}

}  // namespace spex
