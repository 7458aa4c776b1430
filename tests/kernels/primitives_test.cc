// Every primitive of the CPU implementation against the scalar reference, on awkward sizes,
// with 1 and 2 threads, on every SIMD target this CPU supports, including NaN/Inf inputs,
// index validation errors, top-k ties and Sample's determinism.
#include "kernels/primitives.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "kernels/cpu/cpu_primitives.h"
#include "kernels/cpu/top_k.h"
#include "kernels/reference/reference_primitives.h"

namespace spex {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr size_t kSizes[] = {0, 1, 31, (1u << 20) + 7, 3000017};

// Gradient-like values: normal with a heavy tail, a few exact zeros.
std::vector<float> Gradient(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::uniform_int_distribution<int> pick(0, 999);
  std::vector<float> x(n);
  for (float& v : x) {
    const int p = pick(gen);
    v = normal(gen);
    if (p < 5) v *= 100.0f;
    if (p == 999) v = 0.0f;
  }
  return x;
}

// Sprinkles NaN (two payloads), +-Inf, -0, denormals and FLT_MAX over x.
void AddSpecials(std::vector<float>* x, uint32_t seed) {
  if (x->empty()) return;
  uint32_t big_payload_nan_bits = 0x7fc12345u, small_payload_nan_bits = 0xff800001u;
  float nan2, nan3;
  std::memcpy(&nan2, &big_payload_nan_bits, 4);
  std::memcpy(&nan3, &small_payload_nan_bits, 4);
  const float specials[] = {kNaN,  -kNaN, nan2,   nan3,    kInf,
                            -kInf, -0.0f, 1e-42f, -3e-39f, std::numeric_limits<float>::max()};
  std::mt19937 gen(seed);
  std::uniform_int_distribution<size_t> at(0, x->size() - 1);
  const size_t count = std::max<size_t>(10, x->size() / 1000);
  for (size_t j = 0; j < count; ++j) (*x)[at(gen)] = specials[j % 10];
}

// Bitwise equality, so NaNs and signed zeros compare exactly.
::testing::AssertionResult SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      return ::testing::AssertionFailure()
             << "first difference at " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// A threshold that roughly `fraction` of |x| reach.
float Quantile(const std::vector<float>& x, double fraction) {
  if (x.empty()) return 1.0f;
  std::vector<float> a;
  a.reserve(x.size());
  for (float v : x) {
    if (!std::isnan(v)) a.push_back(std::fabs(v));
  }
  if (a.empty()) return 1.0f;
  const size_t pos = std::min(a.size() - 1, static_cast<size_t>((1.0 - fraction) * a.size()));
  std::nth_element(a.begin(), a.begin() + pos, a.end());
  return a[pos];
}

// The first `written` entries agree; the sentinel one past the capacity is untouched. (Slots in
// between may hold scratch: the contract allows it.)
void ExpectSameSelection(const std::vector<uint32_t>& ic, const std::vector<float>& vc,
                         const std::vector<uint32_t>& ir, const std::vector<float>& vr,
                         size_t written) {
  ASSERT_EQ(ic.size(), ir.size());
  EXPECT_TRUE(std::equal(ic.begin(), ic.begin() + written, ir.begin()));
  EXPECT_TRUE(SameBits(std::vector<float>(vc.begin(), vc.begin() + written),
                       std::vector<float>(vr.begin(), vr.begin() + written)));
  EXPECT_EQ(ic.back(), ir.back());
  EXPECT_TRUE(SameBits({vc.back()}, {vr.back()}));
}

class PrimitivesTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    cpu_ = MakeCpuPrimitives(GetParam());
    ref_ = MakeReferencePrimitives();
  }

  // SelectAbove (add == nullptr) or AddSelectAbove on both implementations; compares the
  // count, the written entries and the buffer afterwards.
  void CheckSelect(const std::vector<float>& x0, const std::vector<float>* add, size_t begin,
                   size_t end, float t, bool zero, size_t capacity) {
    SCOPED_TRACE(::testing::Message()
                 << "n=" << x0.size() << " [" << begin << "," << end << ") t=" << t
                 << " zero=" << zero << " cap=" << capacity << " add=" << (add != nullptr));
    std::vector<float> xc = x0, xr = x0;
    std::vector<uint32_t> ic(capacity + 1, 7), ir(capacity + 1, 7);
    std::vector<float> vc(capacity + 1, 7.0f), vr(capacity + 1, 7.0f);
    size_t nc, nr;
    if (add) {
      nc = cpu_->AddSelectAbove(xc.data(), add->data(), begin, end, t, zero, ic.data(), vc.data(),
                                capacity);
      nr = ref_->AddSelectAbove(xr.data(), add->data(), begin, end, t, zero, ir.data(), vr.data(),
                                capacity);
    } else {
      nc = cpu_->SelectAbove(xc.data(), begin, end, t, zero, ic.data(), vc.data(), capacity);
      nr = ref_->SelectAbove(xr.data(), begin, end, t, zero, ir.data(), vr.data(), capacity);
    }
    ASSERT_EQ(nc, nr);
    ExpectSameSelection(ic, vc, ir, vr, std::min(nr, capacity));
    EXPECT_TRUE(SameBits(xc, xr));
  }

  std::unique_ptr<Primitives> cpu_, ref_;
};

TEST_P(PrimitivesTest, AccumulateAndScaleMatchReference) {
  for (size_t n : kSizes) {
    std::vector<float> y = Gradient(n, 1), x = Gradient(n, 2);
    AddSpecials(&x, 3);
    std::vector<float> yr = y;
    cpu_->Accumulate(y.data(), x.data(), n);
    ref_->Accumulate(yr.data(), x.data(), n);
    EXPECT_TRUE(SameBits(y, yr)) << "Accumulate n=" << n;
    cpu_->Scale(y.data(), -0.37f, n);
    ref_->Scale(yr.data(), -0.37f, n);
    EXPECT_TRUE(SameBits(y, yr)) << "Scale n=" << n;
  }
}

// SumScaled (fused on the CPU) against the reference's unfused default: Copy, Accumulate in
// order, Scale; for 1, 2, 3 and 17 inputs (17: more than one pass reads), a == 1 and a != 1.
TEST_P(PrimitivesTest, SumScaledMatchesCopyAccumulateScale) {
  for (size_t n : kSizes) {
    for (int count : {1, 2, 3, 17}) {
      std::vector<std::vector<float>> xs;
      std::vector<const float*> ptrs;
      for (int r = 0; r < count; ++r) {
        xs.push_back(Gradient(n, 10 + r));
        if (r == 1) AddSpecials(&xs.back(), 5);
      }
      for (const auto& x : xs) ptrs.push_back(x.data());
      for (float a : {1.0f, 0.25f, -0.37f}) {
        std::vector<float> y(n, 9.0f), yr(n, 8.0f);
        ASSERT_TRUE(cpu_->SumScaled(y.data(), ptrs.data(), count, a, n).ok());
        ASSERT_TRUE(ref_->SumScaled(yr.data(), ptrs.data(), count, a, n).ok());
        EXPECT_TRUE(SameBits(y, yr)) << "SumScaled n=" << n << " count=" << count << " a=" << a;
      }
    }
  }
  float y = 0;
  EXPECT_FALSE(cpu_->SumScaled(&y, nullptr, 0, 1.0f, 1).ok());
}

TEST_P(PrimitivesTest, CountAboveMatchesReference) {
  for (size_t n : kSizes) {
    std::vector<float> x = Gradient(n, 4);
    AddSpecials(&x, 5);
    for (float t : {-1.0f, 0.0f, Quantile(x, 0.01), Quantile(x, 0.3), kInf, kNaN}) {
      EXPECT_EQ(cpu_->CountAbove(x.data(), n, t), ref_->CountAbove(x.data(), n, t))
          << "n=" << n << " t=" << t;
    }
  }
}

TEST_P(PrimitivesTest, SelectAboveMatchesReference) {
  for (size_t n : kSizes) {
    std::vector<float> x = Gradient(n, 6);
    const size_t count = ref_->CountAbove(x.data(), n, Quantile(x, 0.05));
    for (double fraction : {0.001, 0.05, 1.0}) {
      const float t = fraction == 1.0 ? 0.0f : Quantile(x, fraction);
      for (bool zero : {false, true}) {
        CheckSelect(x, nullptr, 0, n, t, zero, n);
      }
    }
    // Capacities below the count, down to 0, and sub-ranges.
    const float t = Quantile(x, 0.05);
    for (size_t cap : {size_t{0}, size_t{1}, size_t{17}, count / 2, count > 0 ? count - 1 : 0}) {
      CheckSelect(x, nullptr, 0, n, t, true, cap);
    }
    if (n > 10) CheckSelect(x, nullptr, 3, n - 5, t, true, n);
    if (n > 10) CheckSelect(x, nullptr, n / 2 + 1, n / 2 + 1, t, true, n);  // empty range
  }
}

TEST_P(PrimitivesTest, AddSelectAboveMatchesReference) {
  for (size_t n : kSizes) {
    const std::vector<float> acc = Gradient(n, 7), add = Gradient(n, 8);
    const float t = Quantile(acc, 0.01);
    for (bool zero : {false, true}) CheckSelect(acc, &add, 0, n, t, zero, n);
    CheckSelect(acc, &add, 0, n, 0.0f, true, n);
    const size_t quarter = n / 4;
    CheckSelect(acc, &add, 0, n, t, true, quarter);
    if (n > 10) CheckSelect(acc, &add, 5, n - 3, t, true, quarter);
  }
}

TEST_P(PrimitivesTest, SelectWithSpecials) {
  for (size_t n : kSizes) {
    std::vector<float> x = Gradient(n, 9);
    AddSpecials(&x, 10);
    const std::vector<float> add = Gradient(n, 11);
    for (float t : {0.0f, Quantile(x, 0.01), kInf, kNaN}) {
      CheckSelect(x, nullptr, 0, n, t, true, n);
      CheckSelect(x, &add, 0, n, t, true, n);
    }
  }
}

TEST_P(PrimitivesTest, TopKMatchesReference) {
  for (size_t n : kSizes) {
    std::vector<float> x = Gradient(n, 12);
    std::vector<size_t> ks = {0, 1, 7, n / 1000, n / 100};
    if (n < 100000) ks.insert(ks.end(), {n / 2, n, n + 5});
    for (size_t k : ks) {
      std::vector<uint32_t> ic(k + 1, 9), ir(k + 1, 9);
      std::vector<float> vc(k + 1, 9.0f), vr(k + 1, 9.0f);
      const size_t wc = cpu_->TopK(x.data(), n, k, ic.data(), vc.data());
      const size_t wr = ref_->TopK(x.data(), n, k, ir.data(), vr.data());
      ASSERT_EQ(wc, std::min(k, n)) << "n=" << n << " k=" << k;
      ASSERT_EQ(wc, wr);
      EXPECT_EQ(ic, ir) << "n=" << n << " k=" << k;
      EXPECT_TRUE(SameBits(vc, vr)) << "n=" << n << " k=" << k;
    }
  }
}

// Many equal magnitudes: the k-th magnitude is shared, and the lower indices must win. Run on
// a small input (one nth_element) and a large one (histogram path).
TEST_P(PrimitivesTest, TopKTiesGoToLowerIndex) {
  for (size_t n : {size_t{1000}, size_t{300007}}) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = (i % 3 == 0 ? -1.0f : 1.0f) * (i % 5 == 0 ? 2.0f : 0.5f);
    // Magnitude 2 occurs n/5 (rounded up) times; k reaches into the 0.5 ties.
    const size_t twos = (n + 4) / 5;
    for (size_t k : {twos / 2, twos, twos + 3, n - 1}) {
      std::vector<uint32_t> idx(k), ir(k);
      std::vector<float> val(k), vr(k);
      ASSERT_EQ(cpu_->TopK(x.data(), n, k, idx.data(), val.data()), k);
      ref_->TopK(x.data(), n, k, ir.data(), vr.data());
      EXPECT_EQ(idx, ir) << "n=" << n << " k=" << k;
      // Independently: the ties taken are the lowest indices with that magnitude.
      size_t expected_next_half = 0;  // the smallest index with |x| == 0.5 not yet seen
      for (size_t j = 0; j < k; ++j) {
        if (std::fabs(val[j]) != 0.5f) continue;
        while (expected_next_half % 5 == 0) ++expected_next_half;
        ASSERT_EQ(idx[j], expected_next_half) << "k=" << k;
        ++expected_next_half;
      }
    }
  }
}

// NaN never wins while numbers remain; +-Inf beats every finite value; -0 ties with 0.
TEST_P(PrimitivesTest, TopKWithSpecials) {
  for (size_t n : {size_t{31}, size_t{5000}, size_t{400009}}) {
    std::vector<float> x = Gradient(n, 13);
    AddSpecials(&x, 14);
    std::vector<float> sparse(n, 0.0f);  // mostly zeros, a few NaN and numbers
    for (size_t i = 0; i < n; i += 7) sparse[i] = (i % 2) ? kNaN : -0.0f;
    for (size_t i = 3; i < n; i += 101) sparse[i] = static_cast<float>(i);
    for (const std::vector<float>* data : {&x, &sparse}) {
      size_t nan_count = 0;
      for (float v : *data) nan_count += std::isnan(v);
      for (size_t k : {size_t{1}, size_t{5}, n / 100, n - nan_count, n - nan_count / 2, n}) {
        std::vector<uint32_t> ic(k), ir(k);
        std::vector<float> vc(k), vr(k);
        ASSERT_EQ(cpu_->TopK(data->data(), n, k, ic.data(), vc.data()), k);
        ref_->TopK(data->data(), n, k, ir.data(), vr.data());
        EXPECT_EQ(ic, ir) << "n=" << n << " k=" << k;
        EXPECT_TRUE(SameBits(vc, vr)) << "n=" << n << " k=" << k;
      }
    }
  }
}

// The k-th magnitude in the histogram bin shared by +Inf (and small-payload NaNs).
TEST_P(PrimitivesTest, TopKBoundaryAtInfinity) {
  const size_t n = 200003;
  std::vector<float> x = Gradient(n, 15);
  for (size_t i = 11; i < n; i += 1000) x[i] = (i % 2) ? kInf : -kInf;
  uint32_t small_nan_bits = 0x7f800001u;
  float small_nan;
  std::memcpy(&small_nan, &small_nan_bits, 4);
  for (size_t i = 17; i < n; i += 500) x[i] = small_nan;
  for (size_t k : {size_t{50}, size_t{201}, size_t{300}}) {
    std::vector<uint32_t> ic(k), ir(k);
    std::vector<float> vc(k), vr(k);
    ASSERT_EQ(cpu_->TopK(x.data(), n, k, ic.data(), vc.data()), k);
    ref_->TopK(x.data(), n, k, ir.data(), vr.data());
    EXPECT_EQ(ic, ir) << "k=" << k;
    EXPECT_TRUE(SameBits(vc, vr));
  }
}

// Both large-input paths on their own: the sampled threshold and the full histogram.
TEST_P(PrimitivesTest, TopKPathsMatchReference) {
  const size_t n = 300007;
  std::vector<float> x = Gradient(n, 29);
  AddSpecials(&x, 30);
  for (size_t k : {size_t{1}, size_t{300}, size_t{3000}, n / 16}) {
    std::vector<uint32_t> ir(k), ih(k), is(k);
    std::vector<float> vr(k), vh(k), vs(k);
    ref_->TopK(x.data(), n, k, ir.data(), vr.data());
    ASSERT_EQ(HistogramTopK(*cpu_, x.data(), n, k, ih.data(), vh.data()), k);
    EXPECT_EQ(ih, ir) << "histogram k=" << k;
    EXPECT_TRUE(SameBits(vh, vr));
    size_t written = 0;
    ASSERT_TRUE(SampledTopK(*cpu_, x.data(), n, k, is.data(), vs.data(), &written)) << "k=" << k;
    ASSERT_EQ(written, k);
    EXPECT_EQ(is, ir) << "sampled k=" << k;
    EXPECT_TRUE(SameBits(vs, vr));
  }
}

// Large values exactly where the sample looks make the sampled threshold too high: the
// sampled path must notice (fewer than k candidates) and TopK must still be exact.
TEST_P(PrimitivesTest, TopKFallsBackWhenTheSampleMisleads) {
  const size_t n = 300007, stride = n / kTopKSampleBlocks;
  std::vector<float> x = Gradient(n, 31);
  size_t large = 0;
  for (size_t b = 0; b < kTopKSampleBlocks; ++b) {
    for (size_t j = 0; j < kTopKSampleRun / 4; ++j, ++large) x[b * stride + j] = 1.0f + 1e-6f * b;
  }
  const size_t k = large + 1000;  // more than the large ones: the rest come from the bulk
  ASSERT_LE(k, n / 16);
  std::vector<uint32_t> ic(k), ir(k);
  std::vector<float> vc(k), vr(k);
  size_t written = 0;
  EXPECT_FALSE(SampledTopK(*cpu_, x.data(), n, k, ic.data(), vc.data(), &written));
  ASSERT_EQ(cpu_->TopK(x.data(), n, k, ic.data(), vc.data()), k);
  ref_->TopK(x.data(), n, k, ir.data(), vr.data());
  EXPECT_EQ(ic, ir);
  EXPECT_TRUE(SameBits(vc, vr));
}

TEST_P(PrimitivesTest, MomentsMatchReference) {
  for (size_t n : kSizes) {
    for (bool specials : {false, true}) {
      std::vector<float> x = Gradient(n, 16);
      if (specials) {
        AddSpecials(&x, 17);
        for (float& v : x) {  // (Inf is covered below: every sum would be Inf)
          if (std::isinf(v)) v = 1.0f;
        }
      }
      for (float lb : {-1.0f, 0.0f, Quantile(x, 0.1), kInf}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " lb=" << lb << " specials=" << specials);
        const AbsMoments c = cpu_->Moments(x.data(), n, lb);
        const AbsMoments r = ref_->Moments(x.data(), n, lb);
        EXPECT_EQ(c.count, r.count);
        EXPECT_EQ(c.log_count, r.log_count);
        EXPECT_EQ(c.max, r.max);
        EXPECT_NEAR(c.sum, r.sum, 1e-10 * std::fabs(r.sum) + 1e-30);
        EXPECT_NEAR(c.sum_sq, r.sum_sq, 1e-10 * std::fabs(r.sum_sq) + 1e-30);
        // log in float lanes: a few float ulps per entry.
        EXPECT_NEAR(c.sum_log, r.sum_log, 1e-6 * std::fabs(r.sum_log) + 1e-6);
      }
    }
  }
}

// log|x| entry by entry across the whole float range (subnormals, both sides of sqrt(2)
// mantissas, FLT_MAX): 64 copies of one value so the SIMD lanes do the work.
TEST_P(PrimitivesTest, MomentsLogIsAccurateOverTheFloatRange) {
  std::vector<float> values = {
      std::numeric_limits<float>::denorm_min(), 1e-42f, 3e-39f,
      std::numeric_limits<float>::min(),        1.0f,   std::numeric_limits<float>::max()};
  for (int e = -149; e <= 127; e += 3) {
    for (float m : {1.0f, 1.2f, 1.41421f, 1.41422f, 1.7f, 1.9999f}) {
      values.push_back(std::ldexp(m, e));
    }
  }
  for (float v : values) {
    if (v == 0.0f || std::isinf(v)) continue;
    const std::vector<float> x(64, -v);
    const AbsMoments c = cpu_->Moments(x.data(), x.size(), -1.0f);
    const double expected = 64.0 * std::log(static_cast<double>(v));
    EXPECT_NEAR(c.sum_log, expected, 2e-7 * std::fabs(expected) + 1e-5) << "v=" << v;
    EXPECT_EQ(c.log_count, 64u);
  }
}

TEST_P(PrimitivesTest, MomentsWithInfinity) {
  std::vector<float> x = Gradient(1000, 18);
  x[500] = -kInf;
  x[501] = kNaN;
  const AbsMoments c = cpu_->Moments(x.data(), x.size(), -1.0f);
  const AbsMoments r = ref_->Moments(x.data(), x.size(), -1.0f);
  EXPECT_EQ(c.count, r.count);
  EXPECT_EQ(c.count, 999u);  // NaN is never counted
  EXPECT_EQ(c.max, kInf);
  EXPECT_EQ(c.sum, kInf);
  EXPECT_EQ(c.sum_sq, kInf);
  EXPECT_EQ(c.sum_log, kInf);
}

// The fused pass against its parts: acc after the add is the reference's bitwise; the sums are
// the same bits as the CPU Moments of the updated acc (same chunks and lanes) and near the
// reference's.
TEST_P(PrimitivesTest, AccumulateMomentsMatchesItsParts) {
  for (size_t n : kSizes) {
    for (bool specials : {false, true}) {
      std::vector<float> x = Gradient(n, 29), add = Gradient(n, 30);
      if (specials) {
        AddSpecials(&x, 31);
        for (float& v : x) {  // (Inf would make every sum Inf)
          if (std::isinf(v)) v = 1.0f;
        }
      }
      for (float lb : {-1.0f, 0.0f, Quantile(x, 0.1), kInf}) {
        for (int mode = 0; mode < 4; ++mode) {
          const bool with_add = mode & 2, logs = mode & 1;
          SCOPED_TRACE(::testing::Message() << "n=" << n << " lb=" << lb << " specials=" << specials
                                            << " mode=" << mode);
          std::vector<float> xc = x, xr = x;
          const float* a = with_add ? add.data() : nullptr;
          const AbsMoments c = cpu_->AccumulateMoments(xc.data(), a, n, lb, logs);
          const AbsMoments r = ref_->AccumulateMoments(xr.data(), a, n, lb, logs);
          ASSERT_TRUE(SameBits(xc, xr));
          const AbsMoments m = cpu_->Moments(xc.data(), n, lb);
          EXPECT_EQ(c.count, m.count);
          EXPECT_EQ(c.max, m.max);
          EXPECT_EQ(c.sum, m.sum);
          EXPECT_EQ(c.sum_sq, m.sum_sq);
          EXPECT_EQ(c.count, r.count);
          EXPECT_EQ(c.max, r.max);
          EXPECT_NEAR(c.sum, r.sum, 1e-10 * std::fabs(r.sum) + 1e-30);
          if (logs) {
            EXPECT_EQ(c.log_count, m.log_count);
            EXPECT_EQ(c.sum_log, m.sum_log);
            EXPECT_EQ(c.log_count, r.log_count);
          } else {
            EXPECT_EQ(c.log_count, 0u);
            EXPECT_EQ(c.sum_log, 0.0);
            EXPECT_EQ(r.log_count, 0u);
          }
        }
      }
    }
  }
}

// The bins from first_bin on are AbsHistogram16's (the CPU skips the entries below them).
TEST_P(PrimitivesTest, AbsHistogram16FromMatchesTheFullHistogramThere) {
  for (size_t n : kSizes) {
    std::vector<float> x = Gradient(n, 32);
    AddSpecials(&x, 33);
    std::vector<uint32_t> full(Primitives::kHistogramBins, 3);
    ref_->AbsHistogram16(x.data(), 0, n, full.data());
    for (uint32_t first : {0u, 1u, 0x3a83u, 0x3f80u, 0xff00u, 0xffffu, 0x10000u}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " first=" << first);
      std::vector<uint32_t> hc(Primitives::kHistogramBins, 3);
      cpu_->AbsHistogram16From(x.data(), 0, n, first, hc.data());
      for (size_t b = 0; b < Primitives::kHistogramBins; ++b) {
        ASSERT_EQ(hc[b], b >= first ? full[b] : 3u) << "bin " << b;
      }
    }
  }
}

TEST_P(PrimitivesTest, AbsHistogram16MatchesReference) {
  for (size_t n : kSizes) {
    std::vector<float> x = Gradient(n, 19);
    AddSpecials(&x, 20);
    std::vector<uint32_t> hc(Primitives::kHistogramBins, 3), hr(Primitives::kHistogramBins, 3);
    cpu_->AbsHistogram16(x.data(), 0, n, hc.data());
    ref_->AbsHistogram16(x.data(), 0, n, hr.data());
    EXPECT_EQ(hc, hr) << "n=" << n;
    if (n > 10) {  // a sub-range, added on top
      cpu_->AbsHistogram16(x.data(), 4, n - 6, hc.data());
      ref_->AbsHistogram16(x.data(), 4, n - 6, hr.data());
      EXPECT_EQ(hc, hr) << "n=" << n;
    }
  }
}

TEST_P(PrimitivesTest, SampleIsDeterministicAndMatchesReference) {
  const size_t n = 1000003;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  for (size_t m : {size_t{0}, size_t{1}, size_t{1000}, size_t{300001}}) {
    std::vector<float> a(m), b(m), r(m), other(m);
    cpu_->Sample(x.data(), n, m, 42, a.data());
    cpu_->Sample(x.data(), n, m, 42, b.data());
    ref_->Sample(x.data(), n, m, 42, r.data());
    cpu_->Sample(x.data(), n, m, 43, other.data());
    EXPECT_EQ(a, b) << "m=" << m;
    EXPECT_EQ(a, r) << "m=" << m;
    if (m >= 1000) {
      EXPECT_NE(a, other);
      double mean = 0;
      for (float v : a) mean += v;
      mean /= m;
      EXPECT_NEAR(mean, n / 2.0, n * 0.03) << "m=" << m;  // uniform over [0, n)
      EXPECT_LT(*std::max_element(a.begin(), a.end()), n);
    }
  }
  std::vector<float> out(4, 1.0f);
  cpu_->Sample(nullptr, 0, 4, 1, out.data());  // empty input: zeros
  EXPECT_EQ(out, std::vector<float>(4, 0.0f));
}

TEST_P(PrimitivesTest, ScatterGatherZeroMatchReference) {
  for (size_t n : {size_t{1}, size_t{31}, size_t{(1u << 20) + 7}}) {
    std::mt19937 gen(21);
    std::uniform_int_distribution<uint32_t> at(0, static_cast<uint32_t>(n - 1));
    for (size_t m : {size_t{0}, size_t{1}, size_t{33}, n / 3 + 100000}) {
      std::vector<uint32_t> idx(m);
      for (uint32_t& i : idx) i = at(gen);  // with repeats
      const std::vector<float> val = Gradient(m, 22);
      std::vector<float> yc = Gradient(n, 23), yr = yc;
      ASSERT_TRUE(cpu_->ScatterAdd(yc.data(), n, idx.data(), val.data(), m).ok());
      ASSERT_TRUE(ref_->ScatterAdd(yr.data(), n, idx.data(), val.data(), m).ok());
      EXPECT_TRUE(SameBits(yc, yr)) << "ScatterAdd n=" << n << " m=" << m;
      std::vector<float> gc(m), gr(m);
      ASSERT_TRUE(cpu_->Gather(yc.data(), n, idx.data(), m, gc.data()).ok());
      ASSERT_TRUE(ref_->Gather(yr.data(), n, idx.data(), m, gr.data()).ok());
      EXPECT_TRUE(SameBits(gc, gr)) << "Gather n=" << n << " m=" << m;
      ASSERT_TRUE(cpu_->ZeroAt(yc.data(), n, idx.data(), m).ok());
      ASSERT_TRUE(ref_->ZeroAt(yr.data(), n, idx.data(), m).ok());
      EXPECT_TRUE(SameBits(yc, yr)) << "ZeroAt n=" << n << " m=" << m;
    }
  }
}

TEST_P(PrimitivesTest, BadIndicesAreRejectedBeforeAnyWrite) {
  const size_t n = 100;
  std::vector<uint32_t> idx(1000);
  for (size_t j = 0; j < idx.size(); ++j) idx[j] = j % n;
  idx[777] = 100;  // == n
  const std::vector<float> val(idx.size(), 1.0f);
  const std::vector<float> y0 = Gradient(n, 24);
  std::vector<float> y = y0, out(idx.size(), 5.0f);

  absl::Status s = cpu_->ScatterAdd(y.data(), n, idx.data(), val.data(), idx.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("index 100 at position 777"), std::string::npos) << s;
  EXPECT_NE(s.message().find("100 elements"), std::string::npos) << s;
  s = cpu_->ZeroAt(y.data(), n, idx.data(), idx.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SameBits(y, y0));
  s = cpu_->Gather(y.data(), n, idx.data(), idx.size(), out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, std::vector<float>(idx.size(), 5.0f));

  idx[777] = 0xffffffffu;
  s = cpu_->Gather(y.data(), n, idx.data(), idx.size(), out.data());
  EXPECT_NE(s.message().find("index 4294967295 at position 777"), std::string::npos) << s;
  // Empty input is fine even with n == 0.
  EXPECT_TRUE(cpu_->ScatterAdd(nullptr, 0, nullptr, nullptr, 0).ok());
  EXPECT_FALSE(cpu_->ZeroAt(y.data(), 0, idx.data(), 1).ok());
}

// Two callers sharing one object on disjoint data (the pool serves one, the other runs alone).
TEST_P(PrimitivesTest, ConcurrentCallsOnDisjointData) {
  const size_t n = 1500007;
  const std::vector<float> x0 = Gradient(2 * n, 25);
  const float t = Quantile(x0, 0.01);
  std::vector<float> xr = x0;
  std::vector<uint32_t> ir(2 * n);
  std::vector<float> vr(2 * n);
  const size_t ra = ref_->SelectAbove(xr.data(), 0, n, t, true, ir.data(), vr.data(), n);
  const size_t rb =
      ref_->SelectAbove(xr.data(), n, 2 * n, t, true, ir.data() + n, vr.data() + n, n);
  for (int round = 0; round < 5; ++round) {
    std::vector<float> x = x0;
    std::vector<uint32_t> idx(2 * n);
    std::vector<float> val(2 * n);
    size_t ca = 0, cb = 0;
    std::thread other([&] {
      cb = cpu_->SelectAbove(x.data(), n, 2 * n, t, true, idx.data() + n, val.data() + n, n);
    });
    ca = cpu_->SelectAbove(x.data(), 0, n, t, true, idx.data(), val.data(), n);
    other.join();
    ASSERT_EQ(ca, ra);
    ASSERT_EQ(cb, rb);
    EXPECT_TRUE(std::equal(idx.begin(), idx.begin() + ca, ir.begin()));
    EXPECT_TRUE(std::equal(idx.begin() + n, idx.begin() + n + cb, ir.begin() + n));
    EXPECT_TRUE(SameBits(x, xr));
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, PrimitivesTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "threads";
                         });

// The SIMD loops on every target this CPU can run (AVX-512 and without it), forced one by one.
TEST(PrimitivesTargetsTest, EveryTargetMatchesReference) {
  auto ref = MakeReferencePrimitives();
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    EXPECT_STREQ(CpuPrimitivesTarget(), hwy::TargetName(target));
    auto cpu = MakeCpuPrimitives(2);
    for (size_t n : {size_t{31}, size_t{1000}, size_t{300007}}) {
      std::vector<float> x = Gradient(n, 26), add = Gradient(n, 27);
      AddSpecials(&x, 28);
      const float t = Quantile(x, 0.02);
      EXPECT_EQ(cpu->CountAbove(x.data(), n, t), ref->CountAbove(x.data(), n, t));
      for (bool fused : {false, true}) {
        for (size_t cap : {n, n / 100 + 3}) {
          std::vector<float> xc = x, xr = x;
          std::vector<uint32_t> ic(cap + 1), ir(cap + 1);
          std::vector<float> vc(cap + 1), vr(cap + 1);
          size_t nc, nr;
          if (fused) {
            nc = cpu->AddSelectAbove(xc.data(), add.data(), 0, n, t, true, ic.data(), vc.data(),
                                     cap);
            nr = ref->AddSelectAbove(xr.data(), add.data(), 0, n, t, true, ir.data(), vr.data(),
                                     cap);
          } else {
            nc = cpu->SelectAbove(xc.data(), 0, n, t, true, ic.data(), vc.data(), cap);
            nr = ref->SelectAbove(xr.data(), 0, n, t, true, ir.data(), vr.data(), cap);
          }
          EXPECT_EQ(nc, nr);
          ExpectSameSelection(ic, vc, ir, vr, std::min(nr, cap));
          EXPECT_TRUE(SameBits(xc, xr));
        }
      }
      std::vector<float> yc = add, yr = add;
      cpu->Accumulate(yc.data(), x.data(), n);
      ref->Accumulate(yr.data(), x.data(), n);
      cpu->Scale(yc.data(), 3.0f, n);
      ref->Scale(yr.data(), 3.0f, n);
      EXPECT_TRUE(SameBits(yc, yr));
      for (float& v : x) {
        if (std::isinf(v)) v = 2.0f;
      }
      const AbsMoments mc = cpu->Moments(x.data(), n, 1e-4f), mr = ref->Moments(x.data(), n, 1e-4f);
      {
        std::vector<float> fc = x, fr = x;
        const AbsMoments c = cpu->AccumulateMoments(fc.data(), add.data(), n, 1e-4f, true);
        const AbsMoments r = ref->AccumulateMoments(fr.data(), add.data(), n, 1e-4f, true);
        EXPECT_TRUE(SameBits(fc, fr));
        EXPECT_EQ(c.count, r.count);
        EXPECT_EQ(c.max, r.max);
        EXPECT_NEAR(c.sum, r.sum, 1e-10 * r.sum);
        EXPECT_NEAR(c.sum_log, r.sum_log, 1e-6 * std::fabs(r.sum_log) + 1e-6);
        std::vector<uint32_t> hc(Primitives::kHistogramBins), hr(Primitives::kHistogramBins);
        cpu->AbsHistogram16From(x.data(), 0, n, 0x3a00u, hc.data());
        ref->AbsHistogram16(x.data(), 0, n, hr.data());
        EXPECT_TRUE(std::equal(hc.begin() + 0x3a00, hc.end(), hr.begin() + 0x3a00));
      }
      EXPECT_EQ(mc.count, mr.count);
      EXPECT_EQ(mc.max, mr.max);
      EXPECT_NEAR(mc.sum, mr.sum, 1e-10 * mr.sum);
      EXPECT_NEAR(mc.sum_log, mr.sum_log, 1e-6 * std::fabs(mr.sum_log) + 1e-6);
      std::vector<uint32_t> tc(n / 50 + 1), tr(n / 50 + 1);
      std::vector<float> tvc(tc.size()), tvr(tc.size());
      cpu->TopK(x.data(), n, tc.size(), tc.data(), tvc.data());
      ref->TopK(x.data(), n, tr.size(), tr.data(), tvr.data());
      EXPECT_EQ(tc, tr);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// UsableCpus counts the calling thread's affinity mask (what mpirun's binding or taskset left),
// not the machine's CPUs: a thread bound to one CPU sees 1.
TEST(UsableCpus, CountsTheAffinityMaskNotTheMachine) {
  EXPECT_GE(UsableCpus(), 1);
  EXPECT_LE(UsableCpus(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  int seen = -1;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (sched_setaffinity(0, sizeof(one), &one) == 0) seen = UsableCpus();
  });
  t.join();
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(UsableCpus(), CPU_COUNT(&all));  // this thread's mask is unchanged
}

}  // namespace
}  // namespace spex
