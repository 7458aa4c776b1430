// Gaussian-k: the initial threshold is mu + sigma Phi^-1(1 - d/2) of |acc| (sample sigma), the
// refinements follow x0.5 below 2k/3 and x1.5 above 4k/3 (at most 3), and the selection is
// exactly |acc| > threshold with the selected positions zeroed.
#include <cmath>

#include "kernels/compressors/stat_math.h"
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
        if (c < 2.0 * k / 3) th *= 0.5f;
        else if (c > 4.0 * k / 3) th *= 1.5f;
        else break;
      }
      auto c = MustMake("gaussiank", d, n, prims.get());
      std::vector<float> acc = x;
      Selection sel;
      ASSERT_TRUE(c->Select(0, acc.data(), nullptr, true, &sel).ok());
      EXPECT_NEAR(sel.scalars[0], th, 1e-6 * th) << "d=" << d << " dist " << dist;
      EXPECT_EQ(sel.scalars[1], static_cast<float>(rounds));
      EXPECT_EQ(sel.idx, Above(x, sel.scalars[0], true));
      for (uint32_t i : sel.idx) EXPECT_EQ(acc[i], 0.0f);
    }
  }
}

}  // namespace
}  // namespace spex
