// SAGE: alpha, beta and gamma as docs/algorithms.md#sage, Slovin's sample size, and the
// compressor's threshold update th <- th alpha beta gamma with d_exam measured at th alpha,
// selecting exactly |acc| >= th (its one-pass implementation must equal the two-pass reference).
#include "kernels/compressors/sage.h"

#include <cmath>

#include "kernels/compressors/threshold_control.h"
#include "kernels/cpu/cpu_primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

TEST(SageCorrection, AlphaBetaGamma) {
  SageFactors f = SageCorrection(2.0, 1.0, 0.01, 0.01);
  EXPECT_DOUBLE_EQ(f.alpha, 2.0);
  EXPECT_DOUBLE_EQ(f.beta, 1.0);
  EXPECT_DOUBLE_EQ(f.gamma, 1.0);
  f = SageCorrection(1.0, 1.0, 0.01, 0.2);  // 20x too dense
  EXPECT_DOUBLE_EQ(f.beta, 2.0 / (1.0 + std::exp(0.01 - 0.2)));
  EXPECT_GT(f.beta, 1.0);
  EXPECT_DOUBLE_EQ(f.gamma, 1.05);
  f = SageCorrection(1.0, 1.0, 0.01, 0.0005);  // 20x too sparse
  EXPECT_LT(f.beta, 1.0);
  EXPECT_DOUBLE_EQ(f.gamma, 0.95);
  EXPECT_DOUBLE_EQ(SageCorrection(1.0, 1.0, 0.01, 0.1).gamma, 1.0) << "r = 10 is inside";
  EXPECT_DOUBLE_EQ(SageCorrection(1.0, 1.0, 0.01, 0.001).gamma, 1.0) << "r = 0.1 is inside";
  EXPECT_DOUBLE_EQ(SageCorrection(3.0, 0.0, 0.01, 0.01).alpha, 1.0) << "no previous mean";
  EXPECT_DOUBLE_EQ(SageMinBetaGamma(0.01), 0.95 * SageCorrection(1, 1, 0.01, 0).beta);
}

TEST(SageCorrection, SlovinSampleSize) {
  EXPECT_EQ(SlovinSampleSize(25557032), 399u);
  EXPECT_EQ(SlovinSampleSize(100), 80u);
  EXPECT_EQ(SlovinSampleSize(1), 1u);
}

TEST(Sage, ThresholdUpdateAndSelectionMatchTheTwoPassReference) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 200000;
  const double d = 0.01;
  const size_t k = 2000;
  auto c = MustMake("sage", d, n, prims.get(), {{"seed", "3"}});
  std::vector<float> acc(n, 0.0f);
  float th = InitialThreshold(k);
  for (int step = 0; step < 12; ++step) {
    // Scale drifts so alpha matters; 0.004 puts 1/(2 sqrt(k)) near the 1% quantile.
    const std::vector<float> g = Laplace(n, 100 + step, 0.0024f * (1 + 0.2f * (step % 3)));
    std::vector<float> before = acc;
    for (size_t i = 0; i < n; ++i) before[i] += g[i];
    Selection sel;
    ASSERT_TRUE(c->Select(step, acc.data(), g.data(), true, &sel).ok());
    if (step > 0) {
      const double alpha = sel.scalars[1];
      const float exam = static_cast<float>(th * alpha);
      const double d_exam = static_cast<double>(Above(before, exam, false).size()) / n;
      const SageFactors f = SageCorrection(2.0, 2.0 / alpha, d, d_exam);  // alpha as measured
      EXPECT_NEAR(sel.scalars[2], f.beta * f.gamma, 1e-6) << "step " << step;
      th = static_cast<float>(th * alpha * f.beta * f.gamma);
    }
    EXPECT_FLOAT_EQ(sel.scalars[0], th) << "step " << step;
    th = sel.scalars[0];
    EXPECT_EQ(sel.idx, Above(before, th, false)) << "step " << step << ": not |acc| >= th";
    for (uint32_t i : sel.idx) EXPECT_EQ(acc[i], 0.0f);
  }
}

}  // namespace
}  // namespace spex
