// The per-element math the CUDA kernels run (kernels/cuda/device_math.h), compiled for the host
// and checked against kernels/reference: histogram bins, the top-k key order, Sample's draws
// and the moments reduction (sequential and in cub's tree order).
#include "kernels/cuda/device_math.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reference/reference_primitives.h"
#include "tests/cuda/test_data.h"

namespace spex {
namespace {

using testdata::AddSpecials;
using testdata::FromBits;
using testdata::Gradient;
using testdata::kInf;
using testdata::kNaN;

TEST(DeviceMath, AbsBin16MatchesReferenceHistogram) {
  std::vector<float> x = Gradient(20000, 1);
  AddSpecials(&x, 2);
  auto ref = MakeReferencePrimitives();
  std::vector<uint32_t> expected(Primitives::kHistogramBins), ours(Primitives::kHistogramBins);
  ref->AbsHistogram16(x.data(), 0, x.size(), expected.data());
  for (float v : x) ours[gpu::AbsBin16(v)]++;
  EXPECT_EQ(ours, expected);
  EXPECT_EQ(gpu::AbsBin16(kInf), 0xFF00u);
  EXPECT_EQ(gpu::AbsBin16(-0.0f), 0u);
  EXPECT_GT(gpu::AbsBin16(FromBits(0x7fc12345u)), 0xFF00u);
}

TEST(DeviceMath, MagnitudeKeyOrdersLikeTopK) {
  // Ascending by TopK's order: NaN < 0 == -0 < denormal < 1 < FLT_MAX < Inf.
  const float ordered[] = {kNaN, 0.0f, 1e-42f, 1.0f, std::numeric_limits<float>::max(), kInf};
  for (size_t i = 0; i + 1 < std::size(ordered); ++i) {
    EXPECT_LT(gpu::MagnitudeKey(ordered[i]), gpu::MagnitudeKey(ordered[i + 1])) << i;
  }
  EXPECT_EQ(gpu::MagnitudeKey(-0.0f), gpu::MagnitudeKey(0.0f));
  EXPECT_EQ(gpu::MagnitudeKey(-2.5f), gpu::MagnitudeKey(2.5f));
  EXPECT_EQ(gpu::MagnitudeKey(-kNaN), 0u);
  EXPECT_EQ(gpu::MagnitudeKey(FromBits(0xff800001u)), 0u);  // a NaN with a tiny payload
  EXPECT_EQ(gpu::MagnitudeKey(-kInf), 0x7f800001u);
}

TEST(DeviceMath, SampleDrawsMatchReference) {
  auto ref = MakeReferencePrimitives();
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000003}}) {
    std::vector<float> x(n);
    std::iota(x.begin(), x.end(), 0.0f);  // value = index (exact below 2^24)
    for (uint64_t seed : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}}) {
      std::vector<float> expected(500), ours(500);
      ref->Sample(x.data(), n, expected.size(), seed, expected.data());
      for (size_t j = 0; j < ours.size(); ++j) {
        const uint64_t i = gpu::SampleIndex(gpu::SampleRandom(seed, j), n);
        ASSERT_LT(i, n);
        ours[j] = x[i];
      }
      EXPECT_EQ(ours, expected) << "n=" << n << " seed=" << seed;
    }
  }
  EXPECT_EQ(gpu::SampleIndex(~uint64_t{0}, 10), 9u);
  EXPECT_EQ(gpu::SampleIndex(0, 10), 0u);
}

gpu::MomentsAcc Fold(const std::vector<float>& x, float lb, bool tree) {
  std::vector<gpu::MomentsAcc> parts;
  for (float v : x) parts.push_back(gpu::MomentsOf(v, lb));
  if (!tree) {
    gpu::MomentsAcc acc = gpu::MomentsZero();
    for (const auto& p : parts) acc = gpu::MomentsCombine(acc, p);
    return acc;
  }
  if (parts.empty()) return gpu::MomentsZero();
  while (parts.size() > 1) {  // pairwise, as a parallel reduction combines
    std::vector<gpu::MomentsAcc> next;
    for (size_t i = 0; i < parts.size(); i += 2) {
      next.push_back(i + 1 < parts.size() ? gpu::MomentsCombine(parts[i], parts[i + 1]) : parts[i]);
    }
    parts.swap(next);
  }
  return parts[0];
}

TEST(DeviceMath, MomentsMatchReference) {
  auto ref = MakeReferencePrimitives();
  for (bool specials : {false, true}) {
    std::vector<float> x = Gradient(30001, 3);
    if (specials) AddSpecials(&x, 4);
    for (float lb : {-1.0f, 0.0f, 1e-3f, kInf, kNaN}) {
      SCOPED_TRACE(::testing::Message() << "specials=" << specials << " lb=" << lb);
      const AbsMoments e = ref->Moments(x.data(), x.size(), lb);
      const gpu::MomentsAcc seq = Fold(x, lb, false);
      EXPECT_EQ(seq.count, e.count);
      EXPECT_EQ(seq.log_count, e.log_count);
      EXPECT_EQ(seq.max, e.max);
      // Same order as the reference: same doubles (NaN/Inf compare as themselves).
      EXPECT_TRUE(seq.sum == e.sum || (std::isnan(seq.sum) && std::isnan(e.sum)));
      EXPECT_TRUE(seq.sum_log == e.sum_log || (std::isnan(seq.sum_log) && std::isnan(e.sum_log)));
      const gpu::MomentsAcc tree = Fold(x, lb, true);
      EXPECT_EQ(tree.count, e.count);
      EXPECT_EQ(tree.max, e.max);
      if (std::isfinite(e.sum)) {
        EXPECT_NEAR(tree.sum, e.sum, 1e-9 * std::max(1.0, std::fabs(e.sum)));
        EXPECT_NEAR(tree.sum_sq, e.sum_sq, 1e-9 * std::max(1.0, std::fabs(e.sum_sq)));
        EXPECT_NEAR(tree.sum_log, e.sum_log, 1e-9 * std::max(1.0, std::fabs(e.sum_log)));
      } else {
        EXPECT_EQ(tree.sum, e.sum);
      }
    }
  }
}

TEST(DeviceMath, ThresholdPredicateFollowsIeee) {
  EXPECT_TRUE(gpu::AbsAtLeast(-2.0f, 2.0f));
  EXPECT_FALSE(gpu::AbsAtLeast(kNaN, 0.0f));
  EXPECT_FALSE(gpu::AbsAtLeast(1.0f, kNaN));
  EXPECT_TRUE(gpu::AbsAtLeast(-kInf, kInf));
  EXPECT_TRUE(gpu::AbsAtLeast(-0.0f, 0.0f));
}

}  // namespace
}  // namespace spex
