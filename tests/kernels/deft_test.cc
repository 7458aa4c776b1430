// DEFT: the nodes' bins are disjoint and cover every unit (exclusive selection, no build-up),
// the bins rotate with the step, the nodes together select about k, and Update's per-unit union
// counts drive the next packing identically on every node.
#include <set>

#include "kernels/cpu/cpu_primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

TEST(Deft, ExclusiveBinsCoverAllUnitsAndRotate) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 64000;
  const int nodes = 4;
  const double d = 0.01;
  std::vector<std::unique_ptr<Compressor>> c;
  for (int r = 0; r < nodes; ++r) c.push_back(MustMake("deft", d, n, prims.get(), {}, r, nodes));
  std::vector<float> bins_of_rank0;
  for (uint64_t step = 0; step < 8; ++step) {
    std::vector<uint32_t> all;
    std::vector<uint64_t> counts;
    std::set<float> bins;
    float owned_units = 0;
    for (int r = 0; r < nodes; ++r) {
      std::vector<float> acc = Laplace(n, static_cast<uint32_t>(step * 10 + r));
      Selection sel;
      ASSERT_TRUE(c[r]->Select(step, acc.data(), nullptr, false, &sel).ok());
      bins.insert(sel.scalars[1]);
      owned_units += sel.scalars[0];
      all.insert(all.end(), sel.idx.begin(), sel.idx.end());
      counts.push_back(sel.idx.size());
      EXPECT_GT(sel.idx.size(), 0u);
      if (r == 0) bins_of_rank0.push_back(sel.scalars[1]);
    }
    EXPECT_EQ(bins.size(), static_cast<size_t>(nodes)) << "two nodes took one bin";
    EXPECT_EQ(owned_units, 32.0f) << "the bins must cover all 8 x 4 units exactly once";
    std::sort(all.begin(), all.end());
    const size_t total = all.size();
    all.erase(std::unique(all.begin(), all.end()), all.end());
    EXPECT_EQ(all.size(), total) << "selections overlap";
    EXPECT_NEAR(static_cast<double>(total), d * n, 0.3 * d * n) << "exclusive shares of k";
    for (int r = 0; r < nodes; ++r) ASSERT_TRUE(c[r]->Update(step, {counts, all}).ok());
  }
  EXPECT_NE(bins_of_rank0[0], bins_of_rank0[1]) << "bins rotate with the step";
}

}  // namespace
}  // namespace spex
