// DGC: the canonical corrections (x1.3 above 1.3k, x0.7 below 0.7k, at most 10 rounds, stop in
// band) on crafted counts, and the compressor: at most 4k/3 selected (exact top-k among the
// selected beyond that), ties toward the lower index, selection = |acc| >= threshold otherwise.
#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/compressors/threshold_search.h"
#include "kernels/cpu/cpu_primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

TEST(DgcCorrect, StopsInBandOrAfterTenRounds) {
  int rounds;
  // count(t) = 1000 / t: k = 100 wants t = 10.
  auto inv = [](float t) { return static_cast<size_t>(1000.0f / t); };
  EXPECT_EQ(DgcCorrect(10.0f, 100, inv, &rounds), 10.0f);
  EXPECT_EQ(rounds, 0);
  float th = DgcCorrect(5.0f, 100, inv, &rounds);  // 200, then 153 (x1.3), then 118: in band
  EXPECT_EQ(rounds, 2);
  EXPECT_FLOAT_EQ(th, 5.0f * 1.3f * 1.3f);
  EXPECT_GE(1000.0f / th, 70.0f);
  EXPECT_LE(1000.0f / th, 130.0f);
  th = DgcCorrect(40.0f, 100, inv, &rounds);  // 25 < 70: x0.7
  EXPECT_GE(1000.0f / th, 70.0f);
  EXPECT_LE(1000.0f / th, 130.0f);
  EXPECT_GT(rounds, 0);
  // A count that never enters the band: exactly 10 rounds of x1.3.
  th = DgcCorrect(
      1.0f, 100, [](float) { return size_t{1000}; }, &rounds);
  EXPECT_EQ(rounds, kDgcMaxRounds);
  EXPECT_NEAR(th, std::pow(1.3, 10), 1e-3);
  th = DgcCorrect(
      1.0f, 100, [](float) { return size_t{0}; }, &rounds);
  EXPECT_EQ(rounds, kDgcMaxRounds);
  EXPECT_NEAR(th, std::pow(0.7, 10), 1e-6);
}

// The exact top-k by a stable sort, ascending.
std::vector<uint32_t> SortedTopK(const std::vector<float>& x, size_t k) {
  std::vector<uint32_t> order(x.size());
  for (size_t i = 0; i < x.size(); ++i) order[i] = static_cast<uint32_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

TEST(Dgc, NeverMoreThanFourThirdsKAndExactTopKWhenTrimmed) {
  // Cauchy magnitudes and a 3-position sample (sample_ratio 3e-5): the sampled threshold is far
  // too low and ten x1.3 corrections cannot lift it into the band on such a heavy tail, so the
  // over-selection is cut to the exact top-k.
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 100000, k = 1000;
  std::mt19937 gen(5);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>(std::tan(M_PI * (u(gen) - 0.5)));
  const std::vector<uint32_t> top = SortedTopK(x, k);
  int trimmed = 0;
  for (uint64_t step = 0; step < 12; ++step) {
    auto c = MustMake("dgc", 0.01, n, prims.get(),
                      {{"seed", std::to_string(step)}, {"sample_ratio", "3e-5"}});
    std::vector<float> acc = x;
    Selection sel;
    ASSERT_TRUE(c->Select(step, acc.data(), nullptr, true, &sel).ok());
    EXPECT_LE(sel.idx.size() * 3, 4 * k);
    const std::vector<uint32_t> above = Above(x, sel.scalars[0], false);
    if (above.size() * 3 > 4 * k) {
      ++trimmed;
      EXPECT_EQ(sel.idx, top) << "step " << step << ": not the exact top-k";
    } else {
      EXPECT_EQ(sel.idx, above) << "step " << step;
    }
    for (uint32_t i : sel.idx) EXPECT_EQ(acc[i], 0.0f);
  }
  EXPECT_GT(trimmed, 0) << "no step exercised the 4k/3 trim";
}

TEST(Dgc, SelectionIsTheThresholdSetWhenInBand) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 300000;
  for (uint64_t step = 0; step < 5; ++step) {
    const std::vector<float> x = Laplace(n, 70 + static_cast<uint32_t>(step));
    auto c = MustMake("dgc", 0.01, n, prims.get(), {{"seed", "11"}});
    std::vector<float> acc = x;
    Selection sel;
    ASSERT_TRUE(c->Select(step, acc.data(), nullptr, false, &sel).ok());
    const std::vector<uint32_t> above = Above(x, sel.scalars[0], false);
    if (above.size() * 3 <= 4 * 3000) {
      EXPECT_EQ(sel.idx, above);
    } else {
      EXPECT_EQ(sel.idx.size(), 3000u);
    }
    EXPECT_LE(sel.idx.size(), 4000u);
  }
}

}  // namespace
}  // namespace spex
