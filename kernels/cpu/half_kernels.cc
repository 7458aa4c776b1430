// Highway per-target bodies of the bulk half-precision passes declared in kernels/half.h
// (widening, narrowing, the fused widen-and-sum of a half bucket's local reduce), plus the
// dtype names. Compiled once per target through foreach_target.h; the HWY_ONCE section holds
// the dispatching entry points. The lane-wise formulas are the scalar ones of half.h, done on
// 32-bit integer lanes (the half values promoted from 16 bits), so every target gives the same
// bits as the scalar code (kernels/half_test checks all 65536 patterns and the rounding cases).
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/half.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/half_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace spex {
namespace half {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using DH = hn::Rebind<uint16_t, DF>;  // as many 16-bit lanes as float lanes

template <bool kBf16>
HWY_INLINE hn::Vec<DF> WidenBits(hn::Vec<DU> h);

// N half values at p, widened to float lanes.
template <bool kBf16>
HWY_INLINE hn::Vec<DF> LoadWiden(const uint16_t* p) {
  const DU du;
  const DH dh;
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || \
    HWY_TARGET == HWY_AVX3_ZEN4
  if (!kBf16) {  // F16C's vcvtph2ps: exact, NaN quieted with its payload (as F16ToFloat)
    const DF df;
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(df, hn::LoadU(df16, reinterpret_cast<const hwy::float16_t*>(p)));
  }
#endif
  return WidenBits<kBf16>(hn::PromoteTo(du, hn::LoadU(dh, p)));
}

// Half values (one per 32-bit lane, zero-extended) widened to float lanes.
template <bool kBf16>
HWY_INLINE hn::Vec<DF> WidenBits(hn::Vec<DU> h) {
  const DF df;
  const DU du;
  const DI di;
  if (kBf16) return hn::BitCast(df, hn::ShiftLeft<16>(h));
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const auto e = hn::And(h, hn::Set(du, 0x7c00u));
  const auto em = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7fffu)));
  const auto normal = hn::Add(em, hn::Set(du, 112u << 23));
  // Inf and NaN (quieted: bit 22 set where the mantissa is not 0).
  const auto quiet = hn::IfThenElseZero(hn::Ne(hn::And(h, hn::Set(du, 0x3ffu)), hn::Zero(du)),
                                        hn::Set(du, 0x400000u));
  const auto infnan = hn::Or(hn::Add(em, hn::Set(du, 224u << 23)), quiet);
  // Subnormal (and zero): m * 2^-24, exact.
  const auto m = hn::BitCast(di, hn::And(h, hn::Set(du, 0x3ffu)));
  const auto sub = hn::BitCast(du, hn::Mul(hn::ConvertTo(df, m), hn::Set(df, 0x1p-24f)));
  auto bits = hn::IfThenElse(hn::Eq(e, hn::Set(du, 0x7c00u)), infnan, normal);
  bits = hn::IfThenElse(hn::Eq(e, hn::Zero(du)), sub, bits);
  return hn::BitCast(df, hn::Or(bits, sign));
}

// Float lanes rounded (ties to even) to half values, one per 32-bit lane.
template <bool kBf16>
HWY_INLINE hn::Vec<DU> NarrowBits(hn::Vec<DF> v) {
  const DF df;
  const DU du;
  const DI di;
  const auto u = hn::BitCast(du, v);
  const auto a = hn::And(u, hn::Set(du, 0x7fffffffu));
  const auto is_nan = hn::Gt(hn::BitCast(di, a), hn::Set(di, 0x7f800000));
  hn::Vec<DU> out;
  if (kBf16) {
    const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    const auto rounded = hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(du, 0x7fffu)), odd));
    const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
    out = hn::IfThenElse(hn::RebindMask(du, is_nan), quiet, rounded);
  } else {
    const auto sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u));
    const auto t = hn::Sub(a, hn::Set(du, 112u << 23));
    const auto odd = hn::And(hn::ShiftRight<13>(t), hn::Set(du, 1u));
    const auto normal = hn::ShiftRight<13>(hn::Add(hn::Add(t, hn::Set(du, 0xfffu)), odd));
    const auto sub =
        hn::BitCast(du, hn::NearestInt(hn::Mul(hn::BitCast(df, a), hn::Set(df, 0x1p24f))));
    const auto nan =
        hn::Or(hn::Set(du, 0x7e00u), hn::And(hn::ShiftRight<13>(a), hn::Set(du, 0x3ffu)));
    const auto ai = hn::BitCast(di, a);
    auto bits =
        hn::IfThenElse(hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 0x38800000))), sub, normal);
    bits = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x477fefff))),
                          hn::Set(du, 0x7c00u), bits);
    bits = hn::IfThenElse(hn::RebindMask(du, is_nan), nan, bits);
    out = hn::Or(bits, sign);
  }
  return out;
}

// Float lanes rounded (ties to even) to N half values at p.
template <bool kBf16>
HWY_INLINE void NarrowStore(hn::Vec<DF> v, uint16_t* p) {
  const DI di;
  const DH dh;
  hn::StoreU(hn::DemoteTo(dh, hn::BitCast(di, NarrowBits<kBf16>(v))), dh, p);
}

template <bool kBf16>
void WidenLoop(const uint16_t* x, float* y, size_t n) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(LoadWiden<kBf16>(x + i), df, y + i);
  for (; i < n; ++i) y[i] = kBf16 ? Bf16ToFloat(x[i]) : F16ToFloat(x[i]);
}

template <bool kBf16>
void NarrowLoop(const float* x, uint16_t* y, size_t n) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) NarrowStore<kBf16>(hn::LoadU(df, x + i), y + i);
  for (; i < n; ++i) y[i] = kBf16 ? FloatToBf16(x[i]) : FloatToF16(x[i]);
}

// The local reduce's one pass (see half.h). The finite check is the x - x trick of
// simd_kernels.cc (0 for a finite x, NaN otherwise), tested once per vector; the exact index
// comes from the stored lanes.
template <bool kBf16>
size_t SumLoop(float* y, const float* acc, const uint16_t* const* xs, int count, float a, size_t n,
               bool check) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const auto av = hn::Set(df, a);
  const bool scale = a != 1.0f;
  size_t first_bad = n;
  size_t i = 0;
  auto widen1 = [](uint16_t h) { return kBf16 ? Bf16ToFloat(h) : F16ToFloat(h); };
  for (; i + N <= n; i += N) {
    int r = 0;
    auto v = acc != nullptr ? hn::LoadU(df, acc + i) : LoadWiden<kBf16>(xs[r++] + i);
    for (; r < count; ++r) v = hn::Add(v, LoadWiden<kBf16>(xs[r] + i));
    if (scale) v = hn::Mul(v, av);
    hn::StoreU(v, df, y + i);
    if (check && first_bad == n) {
      const auto d = hn::Sub(v, v);
      if (HWY_UNLIKELY(!hn::AllTrue(df, hn::Eq(d, d)))) {
        for (size_t j = 0; j < N; ++j) {
          if (!std::isfinite(y[i + j])) {
            first_bad = i + j;
            break;
          }
        }
      }
    }
  }
  for (; i < n; ++i) {
    int r = 0;
    float v = acc != nullptr ? acc[i] : widen1(xs[r++][i]);
    for (; r < count; ++r) v += widen1(xs[r][i]);
    y[i] = scale ? v * a : v;
    if (check && first_bad == n && !std::isfinite(y[i])) first_bad = i;
  }
  return first_bad;
}

// SumLoop's sum rounded to half values at y (never stored as float32). y may be one of xs:
// every input of a vector is loaded before its lanes are stored.
template <bool kBf16>
size_t SumNarrowLoop(uint16_t* y, const float* acc, const uint16_t* const* xs, int count, float a,
                     size_t n, bool check) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const auto av = hn::Set(df, a);
  const bool scale = a != 1.0f;
  size_t first_bad = n;
  size_t i = 0;
  auto widen1 = [](uint16_t h) { return kBf16 ? Bf16ToFloat(h) : F16ToFloat(h); };
  auto sum1 = [&](size_t j) {
    int r = 0;
    float v = acc != nullptr ? acc[j] : widen1(xs[r++][j]);
    for (; r < count; ++r) v += widen1(xs[r][j]);
    return scale ? v * a : v;
  };
  for (; i + N <= n; i += N) {
    int r = 0;
    auto v = acc != nullptr ? hn::LoadU(df, acc + i) : LoadWiden<kBf16>(xs[r++] + i);
    for (; r < count; ++r) v = hn::Add(v, LoadWiden<kBf16>(xs[r] + i));
    if (scale) v = hn::Mul(v, av);
    if (check && first_bad == n) {
      const auto d = hn::Sub(v, v);
      if (HWY_UNLIKELY(!hn::AllTrue(df, hn::Eq(d, d)))) {
        for (size_t j = i; j < i + N; ++j) {
          if (!std::isfinite(sum1(j))) {
            first_bad = j;
            break;
          }
        }
      }
    }
    NarrowStore<kBf16>(v, y + i);
  }
  for (; i < n; ++i) {
    const float v = sum1(i);
    if (check && first_bad == n && !std::isfinite(v)) first_bad = i;
    y[i] = kBf16 ? FloatToBf16(v) : FloatToF16(v);
  }
  return first_bad;
}

size_t SumNarrowImpl(bool bf16, uint16_t* y, const float* acc, const uint16_t* const* xs, int count,
                     float a, size_t n, bool check) {
  return bf16 ? SumNarrowLoop<true>(y, acc, xs, count, a, n, check)
              : SumNarrowLoop<false>(y, acc, xs, count, a, n, check);
}

// acc[idx[j]] = v - float(round(v)), v = val[j] (val set) or acc[idx[j]]: converted a vector at
// a time, loaded and stored lane by lane. Vector gathers and scatters are microcoded on some
// CPUs: on this project's AMD EPYC they made the whole pass 1.5-2x slower than this. With
// `gathered` set (val null), v is also stored there: the gather of acc at idx and the rounding
// kept in one pass over acc's lines instead of two.
template <bool kBf16>
void KeepRoundingLoop(float* acc, const uint32_t* idx, const float* val, size_t count,
                      float* gathered) {
  const DF df;
  const size_t N = hn::Lanes(df);
  HWY_ALIGN float lanes[hn::MaxLanes(df)];
  size_t j = 0;
  for (; j + N <= count; j += N) {
    if (val == nullptr) {
      for (size_t q = 0; q < N; ++q) lanes[q] = acc[idx[j + q]];
    }
    const auto v = val != nullptr ? hn::LoadU(df, val + j) : hn::Load(df, lanes);
    if (gathered != nullptr) hn::StoreU(v, df, gathered + j);
    hn::Store(hn::Sub(v, WidenBits<kBf16>(NarrowBits<kBf16>(v))), df, lanes);
    for (size_t q = 0; q < N; ++q) acc[idx[j + q]] = lanes[q];
  }
  for (; j < count; ++j) {
    const float v = val != nullptr ? val[j] : acc[idx[j]];
    if (gathered != nullptr) gathered[j] = v;
    acc[idx[j]] = v - (kBf16 ? Bf16ToFloat(FloatToBf16(v)) : F16ToFloat(FloatToF16(v)));
  }
}

void KeepRoundingImpl(bool bf16, float* acc, const uint32_t* idx, const float* val, size_t count,
                      float* gathered) {
  bf16 ? KeepRoundingLoop<true>(acc, idx, val, count, gathered)
       : KeepRoundingLoop<false>(acc, idx, val, count, gathered);
}

void WidenImpl(bool bf16, const uint16_t* x, float* y, size_t n) {
  bf16 ? WidenLoop<true>(x, y, n) : WidenLoop<false>(x, y, n);
}
void NarrowImpl(bool bf16, const float* x, uint16_t* y, size_t n) {
  bf16 ? NarrowLoop<true>(x, y, n) : NarrowLoop<false>(x, y, n);
}
size_t SumImpl(bool bf16, float* y, const float* acc, const uint16_t* const* xs, int count, float a,
               size_t n, bool check) {
  return bf16 ? SumLoop<true>(y, acc, xs, count, a, n, check)
              : SumLoop<false>(y, acc, xs, count, a, n, check);
}
int64_t TargetImpl() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace half
}  // namespace spex
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace spex {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "float32" || name == "fp32") return DType::kFloat32;
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  if (name == "float16" || name == "fp16") return DType::kFloat16;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown data type '", name, "': use float32 (fp32), bfloat16 (bf16) or float16 (fp16)"));
}

namespace half {

HWY_EXPORT(WidenImpl);
HWY_EXPORT(NarrowImpl);
HWY_EXPORT(SumImpl);
HWY_EXPORT(TargetImpl);
HWY_EXPORT(KeepRoundingImpl);
HWY_EXPORT(SumNarrowImpl);

size_t SumWidenNarrow(DType t, uint16_t* y, const float* acc, const uint16_t* const* xs, int count,
                      float a, size_t n, bool check) {
  return HWY_DYNAMIC_DISPATCH(SumNarrowImpl)(t == DType::kBFloat16, y, acc, xs, count, a, n, check);
}

void KeepRounding(DType t, float* acc, const uint32_t* idx, const float* val, size_t count) {
  HWY_DYNAMIC_DISPATCH(KeepRoundingImpl)(t == DType::kBFloat16, acc, idx, val, count, nullptr);
}

void GatherKeepRounding(DType t, float* acc, const uint32_t* idx, size_t count, float* gathered) {
  HWY_DYNAMIC_DISPATCH(KeepRoundingImpl)(t == DType::kBFloat16, acc, idx, nullptr, count, gathered);
}

void Widen(DType t, const uint16_t* x, float* y, size_t n) {
  HWY_DYNAMIC_DISPATCH(WidenImpl)(t == DType::kBFloat16, x, y, n);
}
void Narrow(DType t, const float* x, uint16_t* y, size_t n) {
  HWY_DYNAMIC_DISPATCH(NarrowImpl)(t == DType::kBFloat16, x, y, n);
}
size_t SumWidenScaled(DType t, float* y, const float* acc, const uint16_t* const* xs, int count,
                      float a, size_t n, bool check) {
  return HWY_DYNAMIC_DISPATCH(SumImpl)(t == DType::kBFloat16, y, acc, xs, count, a, n, check);
}
const char* TargetName() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(TargetImpl)()); }

}  // namespace half
}  // namespace spex
#endif  // HWY_ONCE
