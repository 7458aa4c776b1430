// ErrorFeedback: the residual per pattern (A: the whole gathered union zeroed, including indices
// other nodes chose; B: only the node's own selection; D: everything), error feedback off
// clearing acc after each step, and size checks.
#include "kernels/error_feedback.h"

#include "kernels/cpu/cpu_primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

TEST(ErrorFeedback, PatternAZeroesTheWholeUnion) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 1000;
  auto c = MustMake("topk_union", 0.01, n, prims.get(), {}, 0, 2);
  ErrorFeedback ef(prims.get(), n);
  const std::vector<float> g = Laplace(n, 1);
  Selection sel;
  ASSERT_TRUE(ef.Select(c.get(), 0, g.data(), &sel).ok());
  EXPECT_EQ(std::vector<float>(ef.acc(), ef.acc() + n), g) << "A keeps acc until the union";
  std::vector<uint32_t> uni = sel.idx;
  uni.push_back(999);  // chosen by the other node
  std::sort(uni.begin(), uni.end());
  uni.erase(std::unique(uni.begin(), uni.end()), uni.end());
  std::vector<float> mine(uni.size());
  ASSERT_TRUE(ef.GatherAt(uni, mine.data()).ok());
  const std::vector<uint64_t> counts{sel.idx.size(), 1};
  ASSERT_TRUE(ef.Complete(c.get(), 0, {counts, uni}).ok());
  size_t j = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool in = j < uni.size() && uni[j] == i;
    if (in) {
      EXPECT_EQ(mine[j++], g[i]);
    }
    EXPECT_EQ(ef.acc()[i], in ? 0.0f : g[i]) << i;
  }
}

TEST(ErrorFeedback, PatternBKeepsEverythingButTheOwnSelectionAndAccumulates) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 1000;
  auto c = MustMake("topk", 0.01, n, prims.get());
  ErrorFeedback ef(prims.get(), n);
  const std::vector<float> g = Laplace(n, 2);
  Selection sel;
  ASSERT_TRUE(ef.Select(c.get(), 0, g.data(), &sel).ok());
  const std::vector<uint64_t> counts{sel.idx.size()};
  ASSERT_TRUE(ef.Complete(c.get(), 0, {counts, sel.idx}).ok());
  std::vector<float> expect = g;
  for (uint32_t i : sel.idx) expect[i] = 0;
  EXPECT_EQ(std::vector<float>(ef.acc(), ef.acc() + n), expect);
  ASSERT_TRUE(ef.Select(c.get(), 1, g.data(), &sel).ok());
  for (size_t i = 0; i < n; ++i) expect[i] += g[i];
  for (size_t j = 0; j < sel.idx.size(); ++j) {
    EXPECT_EQ(sel.val[j], expect[sel.idx[j]]) << "residual + new gradient";
  }
  double norm = 0;
  for (size_t i = 0; i < n; ++i) norm += static_cast<double>(ef.acc()[i]) * ef.acc()[i];
  EXPECT_NEAR(ef.ResidualNorm(), std::sqrt(norm), 1e-6 * std::sqrt(norm));
}

TEST(ErrorFeedback, DenseSendsEverythingAndOffClearsAfterEachStep) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 1000;
  const std::vector<float> g = Laplace(n, 3);
  {
    auto c = MustMake("dense", 0.01, n, prims.get());
    ErrorFeedback ef(prims.get(), n);
    Selection sel;
    ASSERT_TRUE(ef.Select(c.get(), 0, g.data(), &sel).ok());
    EXPECT_TRUE(sel.all);
    EXPECT_EQ(sel.val, g);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(ef.acc()[i], 0.0f);
  }
  for (const char* name : {"topk", "micro"}) {
    auto c = MustMake(name, 0.01, n, prims.get());
    ErrorFeedback ef(prims.get(), n, /*enabled=*/false);
    EXPECT_FALSE(ef.enabled());
    Selection sel;
    for (int step = 0; step < 2; ++step) {
      ASSERT_TRUE(ef.Select(c.get(), step, g.data(), &sel).ok());
      for (size_t j = 0; j < sel.idx.size(); ++j) EXPECT_EQ(sel.val[j], g[sel.idx[j]]) << name;
      const std::vector<uint64_t> counts{sel.idx.size()};
      ASSERT_TRUE(ef.Complete(c.get(), step, {counts, sel.idx}).ok());
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(ef.acc()[i], 0.0f) << name << " kept a residual";
    }
  }
}

TEST(ErrorFeedback, RejectsACompressorOfAnotherSize) {
  auto prims = MakeCpuPrimitives(1);
  auto c = MustMake("topk", 0.01, 500, prims.get());
  ErrorFeedback ef(prims.get(), 1000);
  Selection sel;
  EXPECT_EQ(ef.Select(c.get(), 0, nullptr, &sel).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace spex
