// Random-k and thresh: random-k draws exactly k distinct positions (dense and sparse draws),
// reproducible for a seed and independent across nodes, steps and seeds; thresh selects exactly
// |acc| >= 1 / (2 sqrt(k)) or the configured constant.
#include <set>

#include "kernels/compressors/threshold_control.h"
#include "kernels/cpu/cpu_primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

std::vector<uint32_t> Draw(Primitives* p, double d, size_t n, const std::string& seed, int rank,
                           uint64_t step) {
  auto c = MustMake("randomk", d, n, p, {{"seed", seed}}, rank, 4);
  std::vector<float> acc = Laplace(n, 1);
  Selection sel;
  EXPECT_TRUE(c->Select(step, acc.data(), nullptr, false, &sel).ok());
  for (size_t j = 0; j < sel.idx.size(); ++j) EXPECT_EQ(sel.val[j], acc[sel.idx[j]]);
  return sel.idx;
}

TEST(RandomK, ExactlyKDistinctAndSeeded) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 50000;
  for (double d : {0.001, 0.01, 0.4, 1.0}) {
    const size_t k = static_cast<size_t>(d * n);
    const std::vector<uint32_t> a = Draw(prims.get(), d, n, "5", 0, 3);
    ASSERT_EQ(a.size(), k);
    EXPECT_EQ(std::set<uint32_t>(a.begin(), a.end()).size(), k);
    EXPECT_EQ(a, Draw(prims.get(), d, n, "5", 0, 3)) << "same seed, same draw";
    if (d < 1) {
      EXPECT_NE(a, Draw(prims.get(), d, n, "6", 0, 3)) << "seed";
      EXPECT_NE(a, Draw(prims.get(), d, n, "5", 1, 3)) << "node";
      EXPECT_NE(a, Draw(prims.get(), d, n, "5", 0, 4)) << "step";
    }
  }
  // Roughly uniform: each tenth of the vector gets about a tenth of the draws.
  const std::vector<uint32_t> a = Draw(prims.get(), 0.2, n, "9", 0, 0);
  std::vector<int> tenth(10);
  for (uint32_t i : a) tenth[i * 10 / n]++;
  for (int t : tenth) EXPECT_NEAR(t, 1000, 150);
}

TEST(Thresh, SelectsAtTheHeuristicOrTheConfiguredThreshold) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 100000;
  const std::vector<float> x = Laplace(n, 4, 0.002f);
  std::vector<float> acc = x;
  Selection sel;
  auto c = MustMake("thresh", 0.01, n, prims.get());
  ASSERT_TRUE(c->Select(0, acc.data(), nullptr, false, &sel).ok());
  EXPECT_EQ(sel.scalars[0], InitialThreshold(1000));
  EXPECT_EQ(sel.idx, Above(x, InitialThreshold(1000), false));
  auto fixed = MustMake("thresh", 0.01, n, prims.get(), {{"threshold", "0.004"}});
  ASSERT_TRUE(fixed->Select(0, acc.data(), nullptr, false, &sel).ok());
  EXPECT_EQ(sel.idx, Above(x, 0.004f, false));
}

}  // namespace
}  // namespace spex
