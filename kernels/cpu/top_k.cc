// Exact top-k by magnitude in about one pass for host-memory Primitives (top_k.h).
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
// A boundary bin holding more than n / this (and more than 4k) entries is ranked in place
// (TopKInLargeBin) instead of being copied out as candidates.
constexpr size_t kLargeBinFraction = 16;

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
  for (size_t j = 0; j < count; ++j) ++hist[Primitives::MagnitudeBits(cval[j]) >> 15];
  size_t above = 0;
  uint32_t bin = kInfBin;
  while (above + hist[bin] < k) above += hist[bin--];

  std::vector<uint32_t> keys;
  keys.reserve(hist[bin]);
  for (size_t j = 0; j < count; ++j) {
    const uint32_t u = Primitives::MagnitudeBits(cval[j]);
    if ((u >> 15) == bin) keys.push_back(u);
  }
  return Primitives::TopKFromBoundaryBin(cidx, cval, count, k, above, &keys, idx, val);
}

// Every entry with |x| >= t (in index order) into freshly sized buffers; `hint` is the expected
// count. Returns the count; when it exceeds both the hint and `limit`, the buffers hold only the
// first entries (the caller gives up on them).
size_t SelectCandidates(Primitives& p, const float* x, size_t n, float t, size_t hint, size_t limit,
                        std::unique_ptr<uint32_t[]>* cidx, std::unique_ptr<float[]>* cval) {
  size_t cap = std::min(n, hint);
  cidx->reset(new uint32_t[cap]);
  cval->reset(new float[cap]);
  const size_t count =
      p.SelectAbove(const_cast<float*>(x), 0, n, t, /*zero=*/false, cidx->get(), cval->get(), cap);
  if (count > cap && count <= limit) {  // more than expected: once more with room for all
    cap = count;
    cidx->reset(new uint32_t[cap]);
    cval->reset(new float[cap]);
    p.SelectAbove(const_cast<float*>(x), 0, n, t, false, cidx->get(), cval->get(), cap);
  }
  return count;
}

// The top k once the k-th key is known: `kth`, with exactly `greater` (< k) numbers above it, so
// the result is every entry above kth plus the first k - greater entries at kth (ties toward the
// lower index). Writes exactly what TopKOfCandidates would, without copying the ties out: the
// first k entries at or above kth (one select, its count returned) hold every tie that makes it
// and the higher entries before the last of them, and one more select from there writes the
// higher entries after it. Returns false (idx and val written, but not the result) when fewer
// than k entries reach kth, i.e. `kth` was wrong.
bool TopKAtKey(Primitives& p, const float* x, size_t n, size_t k, uint32_t kth, size_t greater,
               uint32_t* idx, float* val) {
  // Casting away const is safe: nothing is zeroed (zero = false).
  float* xs = const_cast<float*>(x);
  if (p.SelectAbove(xs, 0, n, FromBits(kth), /*zero=*/false, idx, val, k) < k) return false;
  const size_t need = k - greater;  // ties at kth that make it, >= 1
  // At most `greater` of the first k entries >= kth lie above it, so `need` ties are among them.
  size_t m = 0, ties = 0;
  while (ties < need) ties += Primitives::MagnitudeBits(val[m++]) == kth;
  const size_t rest = greater - (m - need);  // the higher entries after idx[m - 1]
  if (rest > 0) {
    (void)p.SelectAbove(xs, size_t{idx[m - 1]} + 1, n, FromBits(kth + 1), false, idx + m, val + m,
                        rest);
  }
  return true;
}

// The top k when a whole run of entries ties at key `kth` and it may be the k-th key: one count
// of the entries above it tells, then TopKAtKey. Returns false when kth is not the k-th key.
bool TiedTopK(Primitives& p, const float* x, size_t n, size_t k, uint32_t kth, uint32_t* idx,
              float* val) {
  if (kth >= kInfKey) return false;  // (+Inf ties: left to the histogram path)
  const size_t greater = p.CountAbove(x, n, FromBits(kth + 1));
  return greater < k && TopKAtKey(p, x, n, k, kth, greater, idx, val);
}

// The top k when the boundary bin `bin` (keys [bin << 15, (bin + 1) << 15)) holds so many entries
// that copying them out as candidates would cost more than scanning x again. `above` numbers lie
// in higher bins, fewer than k. A histogram of the bin's low 15 key bits (one scan, branch-free)
// gives the exact k-th key and how many entries lie above it, then TopKAtKey writes the result.
// Nothing of size n is allocated.
size_t TopKInLargeBin(Primitives& p, const float* x, size_t n, size_t k, uint32_t bin, size_t above,
                      uint32_t* idx, float* val) {
  uint32_t kth = kInfKey;  // bin kInfBin: the Infs all tie (its NaNs are never numbers)
  size_t greater = above;  // entries with a key above kth
  if (bin < kInfBin) {
    // Slot kSub of each table takes the entries outside the bin. Four tables, so that a run of
    // equal keys does not chain every increment on one counter.
    constexpr size_t kSub = size_t{1} << 15, kTable = kSub + 1;
    std::vector<uint32_t> sub(4 * kTable, 0);
    auto slot = [bin](float v) -> size_t {
      const uint32_t u = Primitives::MagnitudeBits(v);
      return (u >> 15) == bin ? (u & (kSub - 1)) : kSub;
    };
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      ++sub[slot(x[i])];
      ++sub[kTable + slot(x[i + 1])];
      ++sub[2 * kTable + slot(x[i + 2])];
      ++sub[3 * kTable + slot(x[i + 3])];
    }
    for (; i < n; ++i) ++sub[slot(x[i])];
    for (size_t low = kSub; low-- > 0;) {
      const size_t here =
          size_t{sub[low]} + sub[kTable + low] + sub[2 * kTable + low] + sub[3 * kTable + low];
      if (greater + here >= k) {
        kth = (bin << 15) | static_cast<uint32_t>(low);
        break;
      }
      greater += here;
    }
  }
  (void)TopKAtKey(p, x, n, k, kth, greater, idx, val);  // kth is exact: it succeeds
  return k;
}

}  // namespace

size_t SmallTopK(const float* x, size_t n, size_t k, uint32_t* idx, float* val) {
  k = std::min(k, n);
  if (k == 0) return 0;
  // Order: larger key first, NaN (key -1) after every number, then lower index.
  auto key = [&](uint32_t i) -> int64_t {
    const uint32_t u = Primitives::MagnitudeBits(x[i]);
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
      const uint32_t u = Primitives::MagnitudeBits(x[i]);
      if (u <= kInfKey) keys.push_back(u);
    }
  }
  // Aim r samples deep, r well above the mean count of samples in the true top k (mu), so
  // that the threshold lets at least k entries through unless the sample is unrepresentative.
  const double mu = static_cast<double>(keys.size()) * k / n;
  const size_t r = static_cast<size_t>(mu + 4.0 * std::sqrt(mu) + 16.0);
  if (r >= keys.size()) return false;
  std::nth_element(keys.begin(), keys.begin() + (r - 1), keys.end(), std::greater<uint32_t>());
  const uint32_t sampled = keys[r - 1];
  // Many samples tie at the sampled key (a constant, all zeros, few distinct values): the
  // candidates would be all of that run, so try it as the exact k-th key instead.
  size_t tied = 0;
  for (uint32_t u : keys) tied += u == sampled;
  if (tied > r) {
    if (!TiedTopK(p, x, n, k, sampled, idx, val)) return false;
    *written = k;
    return true;
  }
  // (Mostly-zero inputs: threshold at the smallest nonzero magnitude rather than at 0.)
  const float threshold = FromBits(std::max<uint32_t>(sampled, 1));
  const size_t expected = static_cast<size_t>(static_cast<double>(n) * r / keys.size());

  std::unique_ptr<uint32_t[]> cidx;
  std::unique_ptr<float[]> cval;
  const size_t count =
      SelectCandidates(p, x, n, threshold, 2 * expected + 4096, n / 4, &cidx, &cval);
  if (count < k || count > n / 4) return false;
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
  if (in_bin > n / kLargeBinFraction && in_bin > 4 * k) {
    return TopKInLargeBin(p, x, n, k, bin, above, idx, val);
  }

  // Everything with |x| >= the bin's lowest magnitude: exactly above + in_bin numbers.
  std::unique_ptr<uint32_t[]> cidx;
  std::unique_ptr<float[]> cval;
  const size_t count =
      SelectCandidates(p, x, n, FromBits(bin << 15), above + in_bin, n, &cidx, &cval);
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
