// topk, gtopk, topk_union and cltk against a plain sorted reference: the selected set is exactly
// the k largest magnitudes, ties at the k-th magnitude going to the lower index; the fused add,
// zero_selected and CLT-k's rotating leader.
#include <algorithm>
#include <numeric>

#include "kernels/cpu/cpu_primitives.h"
#include "kernels/reference/reference_primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

// The k largest |x| by a stable sort (equal magnitudes keep index order), returned ascending.
std::vector<uint32_t> SortedTopK(const std::vector<float>& x, size_t k) {
  std::vector<uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

// Many ties: values from a small set, so the k-th magnitude is shared by many entries.
std::vector<float> Tied(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>(static_cast<int>(gen() % 41) - 20) * 0.25f;
  return x;
}

class TopKTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { prims_ = GetParam() ? MakeCpuPrimitives(2) : MakeReferencePrimitives(); }
  std::unique_ptr<Primitives> prims_;
};

TEST_P(TopKTest, ExactSetEqualsSortedReferenceWithTies) {
  for (const char* name : {"topk", "gtopk", "topk_union"}) {
    for (size_t n : {1000u, 65537u}) {
      for (double d : {0.001, 0.01, 0.3}) {
        const std::vector<float> x = Tied(n, static_cast<uint32_t>(n + 7));
        std::vector<float> acc = x;
        auto c = MustMake(name, d, n, prims_.get());
        Selection sel;
        ASSERT_TRUE(c->Select(0, acc.data(), nullptr, false, &sel).ok());
        const size_t k = std::max<size_t>(1, static_cast<size_t>(std::floor(d * n)));
        EXPECT_EQ(sel.idx, SortedTopK(x, k)) << name << " n=" << n << " d=" << d;
        float kth = INFINITY;
        for (uint32_t i : sel.idx) kth = std::min(kth, std::fabs(x[i]));
        EXPECT_EQ(sel.scalars[0], kth);
        EXPECT_EQ(acc, x) << "acc must be untouched without zero_selected";
      }
    }
  }
}

TEST_P(TopKTest, FusedAddAndZeroSelected) {
  const size_t n = 20000;
  const std::vector<float> a = Laplace(n, 1), g = Laplace(n, 2);
  std::vector<float> sum(n);
  for (size_t i = 0; i < n; ++i) sum[i] = a[i] + g[i];
  std::vector<float> acc = a;
  auto c = MustMake("topk", 0.01, n, prims_.get());
  Selection sel;
  ASSERT_TRUE(c->Select(3, acc.data(), g.data(), true, &sel).ok());
  EXPECT_EQ(sel.idx, SortedTopK(sum, 200));
  size_t j = 0;
  for (size_t i = 0; i < n; ++i) {
    if (j < sel.idx.size() && sel.idx[j] == i) {
      EXPECT_EQ(acc[i], 0.0f);
      EXPECT_EQ(sel.val[j], sum[i]);
      ++j;
    } else {
      EXPECT_EQ(acc[i], sum[i]);
    }
  }
}

TEST_P(TopKTest, CltkLeaderRotatesAndOnlyTheLeaderSelects) {
  const size_t n = 5000;
  const int nodes = 3;
  for (uint64_t step = 0; step < 6; ++step) {
    for (int r = 0; r < nodes; ++r) {
      const std::vector<float> x = Laplace(n, 10 + r);
      std::vector<float> acc = x;
      auto c = MustMake("cltk", 0.01, n, prims_.get(), {}, r, nodes);
      Selection sel;
      ASSERT_TRUE(c->Select(step, acc.data(), nullptr, false, &sel).ok());
      if (static_cast<int>(step % nodes) == r) {
        EXPECT_EQ(sel.idx, SortedTopK(x, 50)) << "leader " << r << " step " << step;
      } else {
        EXPECT_TRUE(sel.idx.empty()) << "non-leader " << r << " selected at step " << step;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CpuAndReference, TopKTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "cpu" : "reference";
                         });

}  // namespace
}  // namespace spex
