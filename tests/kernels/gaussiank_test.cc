// Gaussian-k: the initial threshold is mu + sigma Phi^-1(1 - d/2) of |acc| (sample sigma), the
// published refinements follow x0.5 below 2k/3 and x1.5 above 4k/3 (at most 3; refine=reference),
// the band refinement continues from them by geometric bisection until 2k/3 <= count <= 4k/3
// (spex's default), and the selection is exactly |acc| > threshold with the selected positions
// zeroed.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/compressors/selection.h"
#include "kernels/compressors/stat_math.h"
#include "kernels/compressors/threshold_search.h"
#include "kernels/cpu/cpu_primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

TEST(GaussianK, ThresholdRefinementAndStrictSelection) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 200000;
  for (double d : {0.001, 0.01, 0.05}) {
    for (int dist = 0; dist < 2; ++dist) {
      const std::vector<float> x = dist ? Laplace(n, 21) : Normal(n, 22);
      double s = 0, s2 = 0;
      for (float v : x) {
        s += std::fabs(v);
        s2 += static_cast<double>(v) * v;
      }
      const double mean = s / n, sd = std::sqrt((s2 - s * mean) / (n - 1));
      const size_t k = static_cast<size_t>(d * n);
      float th = static_cast<float>(mean + sd * NormalQuantile(1 - d / 2));
      int rounds = 0;
      for (; rounds < 3; ++rounds) {
        const double c = static_cast<double>(Above(x, th, true).size());
        if (c < 2.0 * k / 3)
          th *= 0.5f;
        else if (c > 4.0 * k / 3)
          th *= 1.5f;
        else
          break;
      }
      auto c = MustMake("gaussiank", d, n, prims.get(), {{"refine", "reference"}});
      std::vector<float> acc = x;
      Selection sel;
      ASSERT_TRUE(c->Select(0, acc.data(), nullptr, true, &sel).ok());
      EXPECT_NEAR(sel.scalars[0], th, 1e-6 * th) << "d=" << d << " dist " << dist;
      EXPECT_EQ(sel.scalars[1], static_cast<float>(rounds));
      EXPECT_EQ(sel.idx, Above(x, sel.scalars[0], true));
      for (uint32_t i : sel.idx) EXPECT_EQ(acc[i], 0.0f);
      // The default (band) refinement: the same selection rule, the count inside the band.
      auto band = MustMake("gaussiank", d, n, prims.get());
      acc = x;
      ASSERT_TRUE(band->Select(0, acc.data(), nullptr, true, &sel).ok());
      EXPECT_EQ(sel.idx, Above(x, sel.scalars[0], true));
      EXPECT_GE(3.0 * sel.idx.size(), 2.0 * k) << "d=" << d << " dist " << dist;
      EXPECT_LE(3.0 * sel.idx.size(), 4.0 * k) << "d=" << d << " dist " << dist;
      if (rounds < kGaussianKRounds) {
        EXPECT_EQ(sel.scalars[0], th) << "inside after the published steps: their threshold";
      }
    }
  }
}

// The default refinement counts on a magnitude histogram; it must decide as with exact counts.
TEST(GaussianK, HistogramCountedRefinementEqualsExactlyCountedOne) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 200000;
  for (double d : {0.01, 0.001}) {
    for (int dist = 0; dist < 2; ++dist) {
      const std::vector<float> x = dist ? Laplace(n, 31) : Normal(n, 32);
      const size_t k = static_cast<size_t>(d * n);
      const AbsMoments m = prims->Moments(x.data(), n, -1.0f);
      const double mean = m.sum / n, var = (m.sum_sq - m.sum * mean) / (n - 1);
      const float th0 = std::max(
          static_cast<float>(mean + std::sqrt(var) * NormalQuantile(1 - d / 2)), kMinThreshold);
      auto exact = [&](float t) { return Above(x, std::max(t, kMinThreshold), true).size(); };
      int rounds;
      const float want = std::max(GaussianKBandRefine(th0, k, kMinThreshold, m.max, exact, &rounds),
                                  kMinThreshold);
      auto c = MustMake("gaussiank", d, n, prims.get());
      std::vector<float> acc = x;
      Selection sel;
      ASSERT_TRUE(c->Select(0, acc.data(), nullptr, false, &sel).ok());
      EXPECT_EQ(sel.scalars[0], want) << "d=" << d << " dist " << dist;
      EXPECT_EQ(sel.scalars[1], static_cast<float>(rounds));
    }
  }
}

TEST(GaussianKBandRefine, ContinuesThePublishedStepsIntoTheBand) {
  // count(t) = 100 t^-8, k = 100 (band [67, 133]): the published steps from 0.5 go x1.5 twice
  // (25600, 998 entries), then x0.5 (39 entries at 1.125), ending unprobed at 0.5625 (9977).
  auto steep = [](float t) { return static_cast<size_t>(100.0 * std::pow(t, -8.0)); };
  std::vector<float> probed;
  auto count = [&](float t) {
    probed.push_back(t);
    return steep(t);
  };
  int rounds;
  EXPECT_FLOAT_EQ(GaussianKRefine(0.5f, 100, count, &rounds), 0.5625f);
  EXPECT_EQ(rounds, 3);
  EXPECT_EQ(probed, (std::vector<float>{0.5f, 0.75f, 1.125f}));
  probed.clear();
  const float th = GaussianKBandRefine(0.5f, 100, 1e-30f, 1e6f, count, &rounds);
  // The same 3 steps, the published final threshold, then the geometric mean of the closest
  // thresholds on either side: sqrt(0.75 * 1.125) (197 entries, too many), then
  // sqrt(0.9186 * 1.125) (88, inside).
  ASSERT_EQ(probed.size(), 6u);
  EXPECT_EQ(std::vector<float>(probed.begin(), probed.begin() + 4),
            (std::vector<float>{0.5f, 0.75f, 1.125f, 0.5625f}));
  EXPECT_NEAR(probed[4], std::sqrt(0.75 * 1.125), 1e-6);
  EXPECT_NEAR(probed[5], std::sqrt(probed[4] * 1.125), 1e-6);
  EXPECT_EQ(th, probed[5]);
  EXPECT_EQ(rounds, 5);
  EXPECT_GE(steep(th), 67u);
  EXPECT_LE(steep(th), 133u);
  // Inside at once: no refinement, as published.
  probed.clear();
  EXPECT_FLOAT_EQ(GaussianKBandRefine(1.0f, 100, 1e-30f, 1e6f, count, &rounds), 1.0f);
  EXPECT_EQ(rounds, 0);
  EXPECT_EQ(probed.size(), 1u);
}

}  // namespace
}  // namespace spex
