#include "kernels/cpu/top_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

namespace spex {
namespace {

constexpr uint32_t kInfKey = 0x7f800000u;  // magnitude bits of +Inf; larger keys are NaN
constexpr uint32_t kInfBin = kInfKey >> 15;
constexpr size_t kSmallTopK = 64 * 1024;

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

// The top k of `count` candidates (ascending indices, no NaN) that contain the top k of the whole
// input: a histogram of the candidates' keys finds the boundary bin, nth_element inside it finds
// the k-th key, and one ordered pass writes the result.
size_t TopKOfCandidates(const uint32_t* cidx, const float* cval, size_t count, size_t k,
                        uint32_t* idx, float* val) {
  std::vector<uint32_t> hist(kInfBin + 1, 0);
  for (size_t j = 0; j < count; ++j) ++hist[MagnitudeKey(cval[j]) >> 15];
  size_t above = 0;
  uint32_t bin = kInfBin;
  while (above + hist[bin] < k) above += hist[bin--];

  std::vector<uint32_t> keys;
  keys.reserve(hist[bin]);
  for (size_t j = 0; j < count; ++j) {
    const uint32_t u = MagnitudeKey(cval[j]);
    if ((u >> 15) == bin) keys.push_back(u);
  }
  const size_t need = k - above;  // 1 <= need <= keys.size()
  std::nth_element(keys.begin(), keys.begin() + (need - 1), keys.end(), std::greater<uint32_t>());
  const uint32_t kth = keys[need - 1];
  size_t greater = 0;
  for (uint32_t u : keys) greater += u > kth;
  size_t ties_left = need - greater;

  size_t w = 0;
  for (size_t j = 0; j < count; ++j) {
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

// Every entry with |x| >= t (in index order) into freshly sized buffers; `hint` is the expected
// count. Returns the count.
size_t SelectCandidates(Primitives& p, const float* x, size_t n, float t, size_t hint,
                        std::unique_ptr<uint32_t[]>* cidx, std::unique_ptr<float[]>* cval) {
  size_t cap = std::min(n, hint);
  cidx->reset(new uint32_t[cap]);
  cval->reset(new float[cap]);
  const size_t count =
      p.SelectAbove(const_cast<float*>(x), 0, n, t, /*zero=*/false, cidx->get(), cval->get(), cap);
  if (count > cap) {  // more than expected: once more with room for all
    cap = count;
    cidx->reset(new uint32_t[cap]);
    cval->reset(new float[cap]);
    p.SelectAbove(const_cast<float*>(x), 0, n, t, false, cidx->get(), cval->get(), cap);
  }
  return count;
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

bool SampledTopK(Primitives& p, const float* x, size_t n, size_t k, uint32_t* idx, float* val,
                 size_t* written) {
  k = std::min(k, n);
  const size_t blocks = std::min(kTopKSampleBlocks, n / kTopKSampleRun);
  if (k == 0 || k > n / 16 || blocks < 64) return false;
  std::vector<uint32_t> keys;
  keys.reserve(blocks * kTopKSampleRun);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t start = b * (n / blocks);
    for (size_t i = start; i < start + kTopKSampleRun; ++i) {
      const uint32_t u = MagnitudeKey(x[i]);
      if (u <= kInfKey) keys.push_back(u);
    }
  }
  // Aim r samples deep, r well above the mean count of samples in the true top k (mu), so
  // that the threshold lets at least k entries through unless the sample is unrepresentative.
  const double mu = static_cast<double>(keys.size()) * k / n;
  const size_t r = static_cast<size_t>(mu + 4.0 * std::sqrt(mu) + 16.0);
  if (r >= keys.size()) return false;
  std::nth_element(keys.begin(), keys.begin() + (r - 1), keys.end(), std::greater<uint32_t>());
  // (Mostly-zero inputs: threshold at the smallest nonzero magnitude rather than at 0.)
  const float threshold = FromBits(std::max<uint32_t>(keys[r - 1], 1));
  const size_t expected = static_cast<size_t>(static_cast<double>(n) * r / keys.size());

  std::unique_ptr<uint32_t[]> cidx;
  std::unique_ptr<float[]> cval;
  const size_t count = SelectCandidates(p, x, n, threshold, 2 * expected + 4096, &cidx, &cval);
  if (count < k) return false;
  *written = TopKOfCandidates(cidx.get(), cval.get(), count, k, idx, val);
  return true;
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
  std::unique_ptr<uint32_t[]> cidx;
  std::unique_ptr<float[]> cval;
  const size_t count = SelectCandidates(p, x, n, FromBits(bin << 15), above + in_bin, &cidx, &cval);
  return TopKOfCandidates(cidx.get(), cval.get(), count, k, idx, val);
}

size_t FastTopK(Primitives& p, const float* x, size_t n, size_t k, uint32_t* idx, float* val) {
  k = std::min(k, n);
  if (k == 0) return 0;
  if (n < kSmallTopK) return SmallTopK(x, n, k, idx, val);
  size_t written = 0;
  if (SampledTopK(p, x, n, k, idx, val, &written)) return written;
  return HistogramTopK(p, x, n, k, idx, val);
}

}  // namespace spex
