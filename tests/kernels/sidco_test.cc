// SIDCo: the scalar statistics (normal quantile, incomplete gamma and its inverse), the
// closed-form thresholds on crafted inputs for every fit (single stage and two stages, computed
// here with plain loops), strict selection at the threshold, the adaptive stage count, and that
// fitting the later stages on the list of stage 1's survivors changes no threshold or selection.
#include <cmath>
#include <cstring>

#include "kernels/compressors/stat_math.h"
#include "kernels/cpu/cpu_primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

TEST(StatMath, NormalQuantile) {
  EXPECT_NEAR(NormalQuantile(0.5), 0.0, 1e-14);
  EXPECT_NEAR(NormalQuantile(0.975), 1.959963984540054, 1e-12);
  EXPECT_NEAR(NormalQuantile(1 - 0.001 / 2), 3.290526731491926, 1e-11);
  EXPECT_NEAR(NormalQuantile(1e-10), -6.361340902404056, 1e-9);
  EXPECT_NEAR(NormalQuantile(0.1), -1.2815515655446004, 1e-12);
}

TEST(StatMath, IncompleteGammaAndItsInverse) {
  for (double x : {0.0, 0.3, 1.0, 5.0, 30.0}) {
    EXPECT_NEAR(RegularizedGammaQ(1.0, x), std::exp(-x), 1e-14);
    EXPECT_NEAR(RegularizedGammaQ(0.5, x), std::erfc(std::sqrt(x)), 1e-13);
  }
  for (double a : {0.2, 0.7, 1.0, 2.5, 10.0, 80.0}) {
    for (double q : {0.5, 0.25, 1e-3, 1e-6}) {
      const double x = InverseRegularizedGammaQ(a, q);
      EXPECT_NEAR(RegularizedGammaQ(a, x) / q, 1.0, 1e-9) << "a=" << a << " q=" << q;
    }
  }
  EXPECT_NEAR(InverseRegularizedGammaQ(1.0, 1e-3), -std::log(1e-3), 1e-10);
}

TEST(StatMath, ClosedForms) {
  EXPECT_DOUBLE_EQ(ExponentialThreshold(2.0, 0.01), -2.0 * std::log(0.01));
  // var = mean^2 makes k = 0: the GPD is the exponential.
  EXPECT_NEAR(GParetoThreshold(2.0, 4.0, 0.01), ExponentialThreshold(2.0, 0.01), 1e-12);
  const double m = 1.5, v = 9.0, m2v = m * m / v, k = 0.5 * (m2v - 1), alpha = 0.5 * m * (m2v + 1);
  EXPECT_NEAR(GParetoThreshold(m, v, 0.001), alpha * (1 - std::pow(0.001, k)) / k, 1e-12);
  // Gamma with shape 1 (s = ln mean - mean log = Euler's gamma for an exponential) ~ exponential.
  EXPECT_NEAR(GammaThreshold(1.0, -0.5772156649, 0.01), -std::log(0.01), 0.15);
}

struct Stats {
  double mean, var, mean_log;
  size_t count;
};
// Plain statistics of |x| over entries with |x| > lb (all when lb < 0), var with n - 1.
Stats Of(const std::vector<float>& x, double lb, bool skip_zero_for_log = false) {
  double s = 0, s2 = 0, sl = 0;
  size_t c = 0;
  for (float v : x) {
    const double a = std::fabs(v);
    if (!(a > lb)) continue;
    if (skip_zero_for_log && a == 0) continue;
    s += a;
    s2 += a * a;
    sl += a > 0 ? std::log(a) : 0;
    ++c;
  }
  const double mean = s / c;
  return {mean, (s2 - s * mean) / (c - 1), sl / c, c};
}

class SidcoTest : public ::testing::Test {
 protected:
  // One Select of `name` with fixed stages on x; checks the selection is exactly |x| > threshold.
  float Threshold(const std::string& name, const std::vector<float>& x, double d, int stages) {
    auto c = MustMake(name, d, x.size(), prims_.get(),
                      {{"stages", std::to_string(stages)}, {"adaptive", "false"}});
    std::vector<float> acc = x;
    Selection sel;
    EXPECT_TRUE(c->Select(0, acc.data(), nullptr, false, &sel).ok());
    EXPECT_EQ(sel.idx, Above(x, sel.scalars[0], true)) << name << ": not |x| > threshold";
    EXPECT_EQ(sel.scalars[1], static_cast<float>(stages)) << "stages used";
    return sel.scalars[0];
  }
  std::unique_ptr<Primitives> prims_ = MakeCpuPrimitives(1);
  const std::vector<float> x_ = Laplace(300000, 5);
};

TEST_F(SidcoTest, SingleStageThresholdsEqualTheClosedForms) {
  const double d = 0.001;
  const Stats s = Of(x_, -1);
  EXPECT_NEAR(Threshold("sidco_e", x_, d, 1), ExponentialThreshold(s.mean, d), 1e-6 * s.mean);
  EXPECT_NEAR(Threshold("sidco_p", x_, d, 1), GParetoThreshold(s.mean, s.var, d), 1e-6 * s.mean);
  const Stats nz = Of(x_, 0.0);
  // The gamma fit is on the non-zero magnitudes (all of them here), its log mean carries the
  // float log's ~1e-7 relative error per entry.
  EXPECT_NEAR(Threshold("sidco_gp", x_, d, 1), GammaThreshold(nz.mean, nz.mean_log, d),
              2e-4 * s.mean);
}

TEST_F(SidcoTest, TwoStagesFitTheExceedancesOverTheFirstThreshold) {
  const double d = 0.001, rho = d / 0.25;
  const Stats s = Of(x_, -1);
  {
    const double eta1 = ExponentialThreshold(s.mean, 0.25);
    const Stats y = Of(x_, static_cast<float>(eta1));
    const double eta2 = eta1 + ExponentialThreshold(y.mean - eta1, rho);
    EXPECT_NEAR(Threshold("sidco_e", x_, d, 2), eta2, 1e-5 * eta2);
  }
  {
    const double eta1 = GParetoThreshold(s.mean, s.var, 0.25);
    const Stats y = Of(x_, static_cast<float>(eta1));
    const double eta2 = eta1 + GParetoThreshold(y.mean - eta1, y.var, rho);
    EXPECT_NEAR(Threshold("sidco_p", x_, d, 2), eta2, 1e-5 * eta2);
  }
  {
    const Stats nz = Of(x_, 0.0);
    const double eta1 = GammaThreshold(nz.mean, nz.mean_log, 0.25);
    const Stats y = Of(x_, static_cast<float>(eta1));
    const double eta2 = eta1 + GParetoThreshold(y.mean - eta1, y.var, rho);
    EXPECT_NEAR(Threshold("sidco_gp", x_, d, 2), eta2, 1e-3 * eta2);
  }
}

TEST_F(SidcoTest, ThreeStagesUseTheEqualPerStageRatio) {
  const double d = 0.001, rho = std::pow(d / 0.25, 0.5);
  double eta = ExponentialThreshold(Of(x_, -1).mean, 0.25);
  for (int s = 0; s < 2; ++s)
    eta += ExponentialThreshold(Of(x_, static_cast<float>(eta)).mean - eta, rho);
  EXPECT_NEAR(Threshold("sidco_e", x_, d, 3), eta, 1e-5 * eta);
  // Stage 3's survivors (~1.6%) are few: they are listed once and the final selection reads the
  // list: moments, moments above eta1, one select = 3 passes.
  auto c =
      MustMake("sidco_p", d, x_.size(), prims_.get(), {{"stages", "3"}, {"adaptive", "false"}});
  std::vector<float> acc = x_;
  Selection sel;
  ASSERT_TRUE(c->Select(0, acc.data(), nullptr, true, &sel).ok());
  EXPECT_EQ(sel.scalars[2], 3.0f);
  EXPECT_EQ(sel.idx, Above(x_, sel.scalars[0], true));
  for (uint32_t i : sel.idx) EXPECT_EQ(acc[i], 0.0f);
  // At d = 0.01 stages 2 and 3 both keep many (rho = 0.2): stage 1's survivors are listed once
  // and read by both stages and the final selection: moments, one select = 2 passes.
  c = MustMake("sidco_p", 0.01, x_.size(), prims_.get(), {{"stages", "3"}, {"adaptive", "false"}});
  acc = x_;
  sel = Selection();
  ASSERT_TRUE(c->Select(0, acc.data(), nullptr, true, &sel).ok());
  EXPECT_EQ(sel.scalars[2], 2.0f);
  EXPECT_EQ(sel.idx, Above(x_, sel.scalars[0], true));
  for (uint32_t i : sel.idx) EXPECT_EQ(acc[i], 0.0f);
}

TEST_F(SidcoTest, StageCountAdaptsEveryFiveCalls) {
  // Single-stage exponential fits on Gaussian data keep far too few (q < 0.8): S grows by one
  // every 5 calls; each update follows the +-20% rule on the calls' own counts.
  const std::vector<float> g = Normal(200000, 9);
  const double d = 0.001;
  auto c = MustMake("sidco_e", d, g.size(), prims_.get(), {{"stages", "1"}});
  int stages = 1;
  double q_sum = 0;
  bool grew = false;
  for (int call = 0; call < 30; ++call) {
    std::vector<float> acc = g;
    Selection sel;
    ASSERT_TRUE(c->Select(call, acc.data(), nullptr, false, &sel).ok());
    ASSERT_EQ(sel.scalars[1], static_cast<float>(stages)) << "call " << call;
    q_sum += sel.idx.size() / (d * g.size());
    if (call % 5 == 4) {
      const double q = q_sum / 5;
      const int before = stages;
      if (q > 1.2) --stages;
      if (q < 0.8) ++stages;
      stages = std::max(1, std::min(stages, 10));
      grew = grew || stages > before;
      q_sum = 0;
    }
  }
  EXPECT_TRUE(grew) << "the stage count never adapted";
}

// |x| scaled Student-t with `dof` degrees of freedom, `zero_percent` of the entries exactly 0
// (the benchmark's gradients: 2.5 dof, 5% zeros).
std::vector<float> StudentT(size_t n, uint32_t seed, float dof, int zero_percent) {
  std::mt19937 gen(seed);
  std::student_t_distribution<float> t(dof);
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<int>(gen() % 100) < zero_percent ? 0.0f : 1e-3f * t(gen);
  return x;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Both paths of one compressor (compact = true / false) on the same steps: every step's
// threshold (to the bit), stage count, selection and the acc left behind must agree. Counts in
// *fewer the steps on which the compact path read acc fewer times.
void ExpectSamePaths(const std::string& name, double d, const std::string& stages, bool adaptive,
                     const std::vector<float>& g, int steps, Primitives* prims, int* fewer) {
  SCOPED_TRACE(name + " d=" + std::to_string(d) + " stages=" + stages);
  const std::string a = adaptive ? "true" : "false";
  auto list = MustMake(name, d, g.size(), prims, {{"stages", stages}, {"adaptive", a}});
  auto full = MustMake(name, d, g.size(), prims,
                       {{"stages", stages}, {"adaptive", a}, {"compact", "false"}});
  std::vector<float> acc_list(g.size(), 0.0f), acc_full(g.size(), 0.0f);
  for (int step = 0; step < steps; ++step) {
    Selection s_list, s_full;
    ASSERT_TRUE(list->Select(step, acc_list.data(), g.data(), true, &s_list).ok());
    ASSERT_TRUE(full->Select(step, acc_full.data(), g.data(), true, &s_full).ok());
    ASSERT_EQ(Bits(s_list.scalars[0]), Bits(s_full.scalars[0])) << "step " << step;
    ASSERT_EQ(s_list.scalars[1], s_full.scalars[1]) << "step " << step;
    *fewer += s_list.scalars[2] < s_full.scalars[2];
    ASSERT_EQ(s_list.idx, s_full.idx) << "step " << step;
    ASSERT_EQ(s_list.val, s_full.val) << "step " << step;
    ASSERT_TRUE(acc_list == acc_full) << "step " << step;
  }
}

TEST(SidcoCompactTest, SameThresholdsAndSelectionsAsAPassPerStage) {
  const size_t n = (size_t{1} << 20) + 37;  // several parallel chunks, an odd tail
  const std::vector<std::vector<float>> inputs = {
      StudentT(n, 21, 2.5f, 5), StudentT(n, 22, 3.0f, 0), Laplace(n, 23), Normal(n, 24)};
  int fewer = 0, steps = 0;
  for (int threads : {1, 2}) {
    auto prims = MakeCpuPrimitives(threads);
    for (size_t in = 0; in < inputs.size(); ++in) {
      SCOPED_TRACE("threads=" + std::to_string(threads) + " input " + std::to_string(in));
      for (const char* name : {"sidco_e", "sidco_p", "sidco_gp"}) {
        for (double d : {0.001, 0.01}) {
          for (const char* stages : {"2", "3", "10"}) {
            ExpectSamePaths(name, d, stages, false, inputs[in], 2, prims.get(), &fewer);
          }
          // Adaptive stage counts over steps with error feedback.
          ExpectSamePaths(name, d, "2", true, inputs[in], 12, prims.get(), &fewer);
          steps += 3 * 2 + 12;
        }
      }
    }
  }
  // The list is used (not always: with one stage over many survivors it saves nothing).
  EXPECT_GT(fewer, steps / 8) << "of " << steps;
}

}  // namespace
}  // namespace spex
