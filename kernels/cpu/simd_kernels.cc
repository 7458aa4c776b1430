// Highway per-target bodies of simd_kernels.h. This file is compiled once per target through
// foreach_target.h; the HWY_ONCE section at the end holds the dispatching entry points.
#include "kernels/cpu/simd_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd_kernels.cc"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace spex {
namespace simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void AccumulateImpl(float* y, const float* x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto a = hn::Add(hn::LoadU(d, y + i), hn::LoadU(d, x + i));
    const auto b = hn::Add(hn::LoadU(d, y + i + N), hn::LoadU(d, x + i + N));
    hn::StoreU(a, d, y + i);
    hn::StoreU(b, d, y + i + N);
  }
  for (; i + N <= n; i += N)
    hn::StoreU(hn::Add(hn::LoadU(d, y + i), hn::LoadU(d, x + i)), d, y + i);
  for (; i < n; ++i) y[i] += x[i];
}

void ScaleImpl(float* x, float a, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto av = hn::Set(d, a);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), av), d, x + i);
  for (; i < n; ++i) x[i] *= a;
}

// The histogram bins (AbsHistogram16's: the magnitude's top 16 bits) of v's entries whose bin is
// above `below` (the first bin counted, less one; bins are below 2^16, so they compare as signed),
// appended at tmp + *len. A whole vector is stored there: tmp needs room for one more beyond.
template <class V, class VI>
HWY_INLINE void AppendBinsAbove(V v, VI below, uint32_t* tmp, size_t* len) {
  const hn::DFromV<VI> di;
  const hn::RebindToUnsigned<decltype(di)> du;
  const auto bin = hn::BitCast(di, hn::ShiftRight<16>(hn::ShiftLeft<1>(hn::BitCast(du, v))));
  const auto m = hn::Gt(bin, below);
  if (HWY_LIKELY(hn::AllFalse(di, m))) return;
  hn::StoreU(hn::BitCast(du, hn::Compress(bin, m)), du, tmp + *len);
  *len += hn::CountTrue(di, m);
}

// One entry's bin, counted when it is `first` or above.
HWY_INLINE void CountBinFrom(float v, uint32_t first, uint32_t* bins) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  const uint32_t b = (u & 0x7fffffffu) >> 15;
  if (b >= first) ++bins[b];
}

// y = a * (xs[0] + ... + xs[count-1]), and with kCheck the lowest i whose y[i] is NaN or +-Inf
// (n when none) found in the same pass. The check costs one subtract and one add per vector:
// x - x is 0 for a finite x and NaN for NaN and +-Inf, and a NaN stays NaN through a sum, so the
// differences of a block of kCheckBlock vectors are summed into one vector that is tested once
// per block (a branch that is almost never taken). Only a block that holds a bad value is
// summed again, vector by vector, for the exact index (the cold path reads the inputs, not y: a
// streamed line is not read back); later blocks are still summed. `stream`: y is written with
// non-temporal stores (after a scalar head up to y's first vector-aligned entry), which saves
// the read-for-ownership of every line of y that a plain store costs: for a y much larger than
// the caches that nothing reads back soon, as many bytes move as in an in-place sum.
// kHist (with kCheck): the |y| histogram of every entry written is counted into `bins` from bin
// `first` on, as Histogram16FromImpl counts it (the bin numbers of a vector's entries in those
// bins compressed into an L1 buffer, counted when it fills), so the range is not read again.
template <bool kCheck, bool kHist = false>
size_t SumScaledLoop(float* y, const float* const* xs, int count, float a, size_t n, bool stream,
                     uint32_t first = 0, uint32_t* bins = nullptr) {
  static_assert(kCheck || !kHist, "the histogram is counted in the checked loop only");
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const hn::RebindToSigned<decltype(d)> di;
  const size_t N = hn::Lanes(d);
  constexpr size_t kCheckBlock = 8;
  const auto av = hn::Set(d, a);
  const bool scale = a != 1.0f;
  size_t first_bad = n;
  size_t i = 0;
  // Room for kTmp bin numbers and one more block's worth (flushed once kTmp are held).
  constexpr size_t kTmp = kHist ? 1024 : 0;
  HWY_ALIGN uint32_t tmp[kTmp + kCheckBlock * hn::MaxLanes(du)];
  size_t len = 0;
  const auto below = hn::Set(di, static_cast<int32_t>(first) - 1);
  auto flush = [&] {
    for (size_t j = 0; j < len; ++j) ++bins[tmp[j]];
    len = 0;
  };
  auto sum = [&](size_t at) {
    auto v = hn::LoadU(d, xs[0] + at);
    for (int r = 1; r < count; ++r) v = hn::Add(v, hn::LoadU(d, xs[r] + at));
    if (scale) v = hn::Mul(v, av);
    return v;
  };
  auto store = [&](decltype(sum(0)) v, size_t at) {
    if (stream) {
      hn::Stream(v, d, y + at);
    } else {
      hn::StoreU(v, d, y + at);
    }
  };
  auto scalar = [&](size_t at) {
    float v = xs[0][at];
    for (int r = 1; r < count; ++r) v += xs[r][at];
    y[at] = scale ? v * a : v;
    if (kCheck && first_bad == n && !std::isfinite(y[at])) first_bad = at;
    if (kHist) CountBinFrom(y[at], first, bins);
  };
  if (stream) {
    for (; i < n && reinterpret_cast<uintptr_t>(y + i) % (N * sizeof(float)) != 0; ++i) scalar(i);
  }
  if (kCheck) {
    HWY_ALIGN float lanes[hn::MaxLanes(d)];
    for (; i + kCheckBlock * N <= n; i += kCheckBlock * N) {
      auto bad = hn::Zero(d);
      for (size_t k = 0; k < kCheckBlock; ++k) {
        const auto v = sum(i + k * N);
        store(v, i + k * N);
        bad = hn::Add(bad, hn::Sub(v, v));
        if (kHist) AppendBinsAbove(v, below, tmp, &len);
      }
      if (kHist && len >= kTmp) flush();
      if (HWY_UNLIKELY(first_bad == n && !hn::AllTrue(d, hn::Eq(bad, bad)))) {
        for (size_t k = 0; k < kCheckBlock * N && first_bad == n; k += N) {
          hn::Store(sum(i + k), d, lanes);  // the same sum as stored, recomputed
          for (size_t j = 0; j < N; ++j) {
            if (!std::isfinite(lanes[j])) {
              first_bad = i + k + j;
              break;
            }
          }
        }
      }
    }
  } else {
    for (; i + N <= n; i += N) store(sum(i), i);
  }
  if (stream) hwy::FlushStream();
  for (; i < n; ++i) scalar(i);
  if (kHist) flush();
  return first_bad;
}

void SumScaledImpl(float* y, const float* const* xs, int count, float a, size_t n, bool stream) {
  SumScaledLoop<false>(y, xs, count, a, n, stream);
}

size_t SumScaledCheckFiniteImpl(float* y, const float* const* xs, int count, float a, size_t n,
                                bool stream) {
  return SumScaledLoop<true>(y, xs, count, a, n, stream);
}

size_t SumScaledCheckFiniteHistogramImpl(float* y, const float* const* xs, int count, float a,
                                         size_t n, bool stream, uint32_t first, uint32_t* bins) {
  return SumScaledLoop<true, true>(y, xs, count, a, n, stream, first, bins);
}

size_t CountAboveImpl(const float* x, size_t n, float t) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto tv = hn::Set(d, t);
  size_t c = 0, i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    c += hn::CountTrue(d, hn::Ge(hn::Abs(hn::LoadU(d, x + i)), tv));
    c += hn::CountTrue(d, hn::Ge(hn::Abs(hn::LoadU(d, x + i + N)), tv));
  }
  for (; i + N <= n; i += N) c += hn::CountTrue(d, hn::Ge(hn::Abs(hn::LoadU(d, x + i)), tv));
  for (; i < n; ++i) c += std::fabs(x[i]) >= t;
  return c;
}

// One pass over [begin, end): optionally x += add (stored back), then every |x| >= t is
// counted, and the first `cap` of them are written (index, value) and zeroed if asked.
// Vectors without a hit cost a load, a compare and a mask test; vectors with hits are
// compressed and stored whole while a whole vector still fits in the output, lane by lane after.
template <bool kAdd>
size_t SelectLoop(float* x, const float* add, size_t begin, size_t end, float t, bool zero,
                  uint32_t* idx, float* val, size_t cap) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const size_t N = hn::Lanes(d);
  const auto tv = hn::Set(d, t);
  HWY_ALIGN float lanes[hn::MaxLanes(d)];
  size_t total = 0;
  size_t i = begin;
  for (; i + N <= end; i += N) {
    auto v = hn::LoadU(d, x + i);
    if (kAdd) v = hn::Add(v, hn::LoadU(d, add + i));
    const auto m = hn::Ge(hn::Abs(v), tv);
    if (HWY_LIKELY(hn::AllFalse(d, m))) {
      if (kAdd) hn::StoreU(v, d, x + i);
      continue;
    }
    const size_t room = total < cap ? cap - total : 0;
    if (HWY_LIKELY(room >= N)) {
      // Compress in registers, then a plain full-width store: the memory form of the
      // compress instruction is microcoded and very slow on AMD Zen 4.
      hn::StoreU(hn::Compress(v, m), d, val + total);
      hn::StoreU(hn::Compress(hn::Iota(du, static_cast<uint32_t>(i)), hn::RebindMask(du, m)), du,
                 idx + total);
      total += hn::CountTrue(d, m);
      if (zero) v = hn::IfThenZeroElse(m, v);
    } else if (room == 0) {
      total += hn::CountTrue(d, m);
    } else {
      hn::Store(v, d, lanes);
      for (size_t j = 0; j < N; ++j) {
        if (!(std::fabs(lanes[j]) >= t)) continue;
        if (total < cap) {
          idx[total] = static_cast<uint32_t>(i + j);
          val[total] = lanes[j];
          if (zero) lanes[j] = 0.0f;
        }
        ++total;
      }
      v = hn::Load(d, lanes);
    }
    if (kAdd || zero) hn::StoreU(v, d, x + i);
  }
  for (; i < end; ++i) {
    float a = x[i];
    if (kAdd) x[i] = a = a + add[i];
    if (!(std::fabs(a) >= t)) continue;
    if (total < cap) {
      idx[total] = static_cast<uint32_t>(i);
      val[total] = a;
      if (zero) x[i] = 0.0f;
    }
    ++total;
  }
  return total;
}

size_t SelectImpl(float* x, size_t begin, size_t end, float t, bool zero, uint32_t* idx, float* val,
                  size_t cap) {
  return SelectLoop<false>(x, nullptr, begin, end, t, zero, idx, val, cap);
}

size_t AddSelectImpl(float* acc, const float* add, size_t begin, size_t end, float t, bool zero,
                     uint32_t* idx, float* val, size_t cap) {
  return SelectLoop<true>(acc, add, begin, end, t, zero, idx, val, cap);
}

// Adds one entry to `m` exactly as the reference does.
inline void MomentsAddScalar(float a, float lower_bound, AbsMoments* m) {
  if (!(a > lower_bound)) return;
  m->count++;
  m->sum += a;
  m->sum_sq += static_cast<double>(a) * a;
  if (a > 0) {
    m->sum_log += std::log(static_cast<double>(a));
    m->log_count++;
  }
  if (a > m->max) m->max = a;
}

// log(a) for lanes with finite a > 0 (other lanes: unspecified). a = 2^e * m with m in
// [sqrt(1/2), sqrt(2)); log(m) = log1p(t) = t - t^2/2 + t^3 q(t), q a degree-6 least-squares fit
// (max relative error 1.4e-7 in float arithmetic). No division, unlike the general Log.
template <class D, class V>
HWY_INLINE V FastLog(D d, V a) {
  const hn::RebindToSigned<D> di;
  constexpr int32_t kSqrtHalfBits = 0x3f3504f3;
  auto scaled = a;
  auto e_adjust = hn::Zero(di);
  const auto subnormal = hn::Lt(a, hn::Set(d, 1.17549435e-38f));
  if (HWY_UNLIKELY(!hn::AllFalse(d, subnormal))) {  // scale by 2^23 so the exponent field is set
    scaled = hn::IfThenElse(subnormal, hn::Mul(a, hn::Set(d, 8388608.0f)), a);
    e_adjust = hn::IfThenElseZero(hn::RebindMask(di, subnormal), hn::Set(di, 23));
  }
  const auto bits = hn::Sub(hn::BitCast(di, scaled), hn::Set(di, kSqrtHalfBits));
  const auto e = hn::Sub(hn::ShiftRight<23>(bits), e_adjust);
  const auto m_bits = hn::Add(hn::And(bits, hn::Set(di, 0x007fffff)), hn::Set(di, kSqrtHalfBits));
  const auto t = hn::Sub(hn::BitCast(d, m_bits), hn::Set(d, 1.0f));
  auto q = hn::Set(d, 0.0850695297f);
  q = hn::MulAdd(q, t, hn::Set(d, -0.141974717f));
  q = hn::MulAdd(q, t, hn::Set(d, 0.149509788f));
  q = hn::MulAdd(q, t, hn::Set(d, -0.165879488f));
  q = hn::MulAdd(q, t, hn::Set(d, 0.199605972f));
  q = hn::MulAdd(q, t, hn::Set(d, -0.250009686f));
  q = hn::MulAdd(q, t, hn::Set(d, 0.333339721f));
  const auto t2 = hn::Mul(t, t);
  const auto log1p = hn::MulAdd(hn::Mul(t2, t), q, hn::NegMulAdd(hn::Set(d, 0.5f), t2, t));
  return hn::MulAdd(hn::ConvertTo(d, e), hn::Set(d, 0.693147180559945f), log1p);
}

// Moments of |x| over x[0..n) (|x| and log|x| in float lanes, sums in double lanes, both halves
// promoted), with the options of Primitives::AccumulateMoments: acc += add first (kAdd; stored
// back), and sum_log/log_count only with kLogs. Moments is <false, true>, so every variant
// accumulates in the same lanes and order and gives the same bits.
template <bool kAdd, bool kLogs>
AbsMoments FusedMomentsLoop(float* acc, const float* add, size_t n, float lower_bound) {
  AbsMoments m;
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<float> d;
  const hn::Half<decltype(d)> dh;
  const hn::Rebind<double, decltype(dh)> dd;
  const size_t N = hn::Lanes(d);
  const auto lb = hn::Set(d, lower_bound);
  const auto zero = hn::Zero(d);
  const auto one = hn::Set(d, 1.0f);
  const auto inf = hn::Set(d, std::numeric_limits<float>::infinity());
  auto sum = hn::Zero(dd), sum_sq = hn::Zero(dd), sum_log = hn::Zero(dd);
  auto vmax = hn::Zero(d);
  size_t count = 0, log_count = 0;
  for (; i + N <= n; i += N) {
    auto v = hn::LoadU(d, acc + i);
    if (kAdd) {
      v = hn::Add(v, hn::LoadU(d, add + i));
      hn::StoreU(v, d, acc + i);
    }
    const auto a = hn::Abs(v);
    const auto in = hn::Gt(a, lb);
    if (hn::AllFalse(d, in)) continue;
    const auto am = hn::IfThenElseZero(in, a);
    count += hn::CountTrue(d, in);
    vmax = hn::Max(vmax, am);
    if (kLogs) {
      const auto pos = hn::And(in, hn::Gt(a, zero));
      log_count += hn::CountTrue(d, pos);
      const auto lg = hn::IfThenElseZero(
          pos, hn::IfThenElse(hn::Eq(a, inf), inf, FastLog(d, hn::IfThenElse(pos, a, one))));
      sum_log = hn::Add(sum_log, hn::Add(hn::PromoteTo(dd, hn::LowerHalf(dh, lg)),
                                         hn::PromoteTo(dd, hn::UpperHalf(dh, lg))));
    }
    const auto lo = hn::PromoteTo(dd, hn::LowerHalf(dh, am));
    const auto hi = hn::PromoteTo(dd, hn::UpperHalf(dh, am));
    sum = hn::Add(sum, hn::Add(lo, hi));
    sum_sq = hn::MulAdd(lo, lo, sum_sq);
    sum_sq = hn::MulAdd(hi, hi, sum_sq);
  }
  m.count = count;
  m.log_count = log_count;
  m.sum = hn::GetLane(hn::SumOfLanes(dd, sum));
  m.sum_sq = hn::GetLane(hn::SumOfLanes(dd, sum_sq));
  m.sum_log = hn::GetLane(hn::SumOfLanes(dd, sum_log));
  m.max = hn::GetLane(hn::MaxOfLanes(d, vmax));
#endif
  for (; i < n; ++i) {
    float a = acc[i];
    if (kAdd) acc[i] = a = a + add[i];
    const double sum_log = m.sum_log;
    const uint64_t log_count = m.log_count;
    MomentsAddScalar(std::fabs(a), lower_bound, &m);
    if (!kLogs) {
      m.sum_log = sum_log;
      m.log_count = log_count;
    }
  }
  return m;
}

// Primitives::Moments: the fused loop without the add (x is only read) and with the logs.
AbsMoments MomentsImpl(const float* x, size_t n, float lower_bound) {
  return FusedMomentsLoop<false, true>(const_cast<float*>(x), nullptr, n, lower_bound);
}

AbsMoments FusedMomentsImpl(float* acc, const float* add, size_t n, float lower_bound, bool logs) {
  if (add) {
    return logs ? FusedMomentsLoop<true, true>(acc, add, n, lower_bound)
                : FusedMomentsLoop<true, false>(acc, add, n, lower_bound);
  }
  return logs ? FusedMomentsLoop<false, true>(acc, add, n, lower_bound)
              : FusedMomentsLoop<false, false>(acc, add, n, lower_bound);
}

// Histogram16Impl for the bins from `first` on: the bin numbers of a vector's entries in those
// bins are compressed into the L1 buffer, so entries below them cost no increment.
void Histogram16FromImpl(const float* x, size_t n, uint32_t first, uint32_t* bins) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const hn::RebindToSigned<decltype(d)> di;
  const size_t N = hn::Lanes(du);
  constexpr size_t kBlock = 1024;
  HWY_ALIGN uint32_t tmp[kBlock + hn::MaxLanes(du)];
  const auto below = hn::Set(di, static_cast<int32_t>(first) - 1);
  size_t i = 0;
  while (i + N <= n) {
    const size_t block_end = i + std::min(kBlock, (n - i) / N * N);
    size_t len = 0;
    for (; i < block_end; i += N) AppendBinsAbove(hn::LoadU(d, x + i), below, tmp, &len);
    for (size_t j = 0; j < len; ++j) ++bins[tmp[j]];
  }
  for (; i < n; ++i) CountBinFrom(x[i], first, bins);
}

// Bin numbers for a block are computed in SIMD lanes into a small L1-resident buffer, then
// counted with scalar increments (about a third fewer instructions per element than a plain loop).
void Histogram16Impl(const float* x, size_t n, uint32_t* bins) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const size_t N = hn::Lanes(du);
  constexpr size_t kBlock = 1024;
  HWY_ALIGN uint32_t tmp[kBlock];
  size_t i = 0;
  if (N <= kBlock) {
    for (; i + kBlock <= n; i += kBlock) {
      for (size_t j = 0; j < kBlock; j += N) {
        const auto bits = hn::BitCast(du, hn::LoadU(d, x + i + j));
        hn::Store(hn::ShiftRight<16>(hn::ShiftLeft<1>(bits)), du, tmp + j);
      }
      for (size_t j = 0; j < kBlock; j += 4) {
        ++bins[tmp[j]];
        ++bins[tmp[j + 1]];
        ++bins[tmp[j + 2]];
        ++bins[tmp[j + 3]];
      }
    }
  }
  for (; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, sizeof(u));
    ++bins[(u & 0x7fffffffu) >> 15];
  }
}

uint32_t MaxIndexImpl(const uint32_t* idx, size_t m) {
  const hn::ScalableTag<uint32_t> d;
  const size_t N = hn::Lanes(d);
  auto vmax = hn::Zero(d);
  size_t j = 0;
  for (; j + N <= m; j += N) vmax = hn::Max(vmax, hn::LoadU(d, idx + j));
  uint32_t r = hn::GetLane(hn::MaxOfLanes(d, vmax));
  for (; j < m; ++j) r = idx[j] > r ? idx[j] : r;
  return r;
}

int64_t TargetImpl() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace simd
}  // namespace spex
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace spex {
namespace simd {

HWY_EXPORT(AccumulateImpl);
HWY_EXPORT(ScaleImpl);
HWY_EXPORT(SumScaledImpl);
HWY_EXPORT(SumScaledCheckFiniteImpl);
HWY_EXPORT(CountAboveImpl);
HWY_EXPORT(SelectImpl);
HWY_EXPORT(AddSelectImpl);
HWY_EXPORT(MomentsImpl);
HWY_EXPORT(FusedMomentsImpl);
HWY_EXPORT(Histogram16FromImpl);
HWY_EXPORT(SumScaledCheckFiniteHistogramImpl);
HWY_EXPORT(Histogram16Impl);
HWY_EXPORT(MaxIndexImpl);
HWY_EXPORT(TargetImpl);

void Accumulate(float* y, const float* x, size_t n) {
  HWY_DYNAMIC_DISPATCH(AccumulateImpl)(y, x, n);
}
void Scale(float* x, float a, size_t n) { HWY_DYNAMIC_DISPATCH(ScaleImpl)(x, a, n); }
void SumScaled(float* y, const float* const* xs, int count, float a, size_t n, bool stream) {
  HWY_DYNAMIC_DISPATCH(SumScaledImpl)(y, xs, count, a, n, stream);
}
size_t SumScaledCheckFinite(float* y, const float* const* xs, int count, float a, size_t n,
                            bool stream) {
  return HWY_DYNAMIC_DISPATCH(SumScaledCheckFiniteImpl)(y, xs, count, a, n, stream);
}
size_t SumScaledCheckFiniteHistogram(float* y, const float* const* xs, int count, float a, size_t n,
                                     bool stream, uint32_t first, uint32_t* bins) {
  return HWY_DYNAMIC_DISPATCH(SumScaledCheckFiniteHistogramImpl)(y, xs, count, a, n, stream, first,
                                                                 bins);
}
size_t CountAbove(const float* x, size_t n, float t) {
  return HWY_DYNAMIC_DISPATCH(CountAboveImpl)(x, n, t);
}
size_t Select(float* x, size_t begin, size_t end, float t, bool zero, uint32_t* idx, float* val,
              size_t capacity) {
  return HWY_DYNAMIC_DISPATCH(SelectImpl)(x, begin, end, t, zero, idx, val, capacity);
}
size_t AddSelect(float* acc, const float* add, size_t begin, size_t end, float t, bool zero,
                 uint32_t* idx, float* val, size_t capacity) {
  return HWY_DYNAMIC_DISPATCH(AddSelectImpl)(acc, add, begin, end, t, zero, idx, val, capacity);
}
AbsMoments Moments(const float* x, size_t n, float lower_bound) {
  return HWY_DYNAMIC_DISPATCH(MomentsImpl)(x, n, lower_bound);
}
AbsMoments FusedMoments(float* acc, const float* add, size_t n, float lower_bound, bool logs) {
  return HWY_DYNAMIC_DISPATCH(FusedMomentsImpl)(acc, add, n, lower_bound, logs);
}
void Histogram16From(const float* x, size_t n, uint32_t first, uint32_t* bins) {
  HWY_DYNAMIC_DISPATCH(Histogram16FromImpl)(x, n, first, bins);
}
void Histogram16(const float* x, size_t n, uint32_t* bins) {
  HWY_DYNAMIC_DISPATCH(Histogram16Impl)(x, n, bins);
}
uint32_t MaxIndex(const uint32_t* idx, size_t m) {
  return HWY_DYNAMIC_DISPATCH(MaxIndexImpl)(idx, m);
}
const char* TargetName() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(TargetImpl)()); }

}  // namespace simd
}  // namespace spex
#endif  // HWY_ONCE
