// ExDyna: the block layout (docs/algorithms.md#exdyna; a ResNet-18-sized example), the
// allocation sweep on crafted counts (left/right moves, estimates updated within the sweep, never
// below the minimum, no division by zero when the average is 0), and the compressor moving its
// partition boundaries from gathered counts.
#include "kernels/compressors/exdyna.h"

#include <numeric>

#include "kernels/cpu/cpu_primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

TEST(ExDynaLayout, ResNet18Example) {
  auto l = ExDynaLayout::Make(11173962, 8);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->block_size(), 10912u);
  EXPECT_EQ(l->num_blocks(), 1024u);
  EXPECT_DOUBLE_EQ(l->min_blocks(), 32.0);
  for (int64_t b : l->blocks()) EXPECT_EQ(b, 128);
  size_t begin = 0;
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(l->Partition(j).begin, begin);
    begin = l->Partition(j).end;
  }
  EXPECT_EQ(begin, 11173962u) << "the 74 leftover elements belong to the last partition";
  EXPECT_EQ(l->Partition(7).size(), 128u * 10912 + 74);
}

TEST(ExDynaLayout, SmallBucketsAndTooManyNodes) {
  auto l = ExDynaLayout::Make(5000, 4);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->block_size(), 4u);
  EXPECT_EQ(l->Partition(3).end, 5000u);
  EXPECT_FALSE(ExDynaLayout::Make(3, 4).ok());
}

// n = 131072 gives 1024 blocks of 128; with k_prev = 65536 (density 1/2) each move shifts the
// count estimates by int(128 * 0.5) = 64.
constexpr size_t kN = 131072;

TEST(ExDynaAllocate, LeftHeavyRightLightMovesTheBoundaryLeft) {
  auto l = ExDynaLayout::Make(kN, 4);
  ASSERT_TRUE(l.ok());
  // k_prev 1024: avg 256 and one block moves the estimates by int(128 / 128) = 1. 600 is heavy
  // and 100 light; the later pairs (101 vs 162, 162 vs 162: light and light) do not move.
  EXPECT_EQ(l->Allocate({600, 100, 162, 162}, 1024), 1);
  EXPECT_EQ(l->blocks(), (std::vector<int64_t>{255, 257, 256, 256}));
  EXPECT_EQ(l->Partition(1).begin, 255u * 128);
}

TEST(ExDynaAllocate, LeftLightRightHeavyMovesItRightThenTheNextPairSeesTheNewEstimate) {
  auto l = ExDynaLayout::Make(kN, 4);
  ASSERT_TRUE(l.ok());
  // Pair 0: light/heavy -> right (600 becomes 599); pair 1: 599 heavy, 100 light -> left.
  EXPECT_EQ(l->Allocate({100, 600, 100, 224}, 1024), 2);
  EXPECT_EQ(l->blocks(), (std::vector<int64_t>{257, 254, 257, 256}));
}

TEST(ExDynaAllocate, EstimatesAreUpdatedWithinTheSweep) {
  auto l = ExDynaLayout::Make(kN, 4);
  ASSERT_TRUE(l.ok());
  // avg 16384. Pair 0 moves left and lifts partition 1 from light (0.9503) to 0.9542 by +64, so
  // pair 1 (partition 2 heavy) must NOT move; pair 2 (heavy, light) moves left.
  EXPECT_EQ(l->Allocate({18000, 15570, 18000, 13966}, 65536), 2);
  EXPECT_EQ(l->blocks(), (std::vector<int64_t>{255, 257, 255, 257}));
}

TEST(ExDynaAllocate, NeverBelowTheMinimum) {
  auto l = ExDynaLayout::Make(kN, 4);
  ASSERT_TRUE(l.ok());
  ASSERT_DOUBLE_EQ(l->min_blocks(), 64.0);
  for (int i = 0; i < 400; ++i) l->Allocate({3000, 10, 500, 500}, 4010);
  EXPECT_EQ(l->blocks()[0], 64) << "stops at the minimum, not below";
  for (int64_t b : l->blocks()) EXPECT_GE(b, 64);
  EXPECT_EQ(std::accumulate(l->blocks().begin(), l->blocks().end(), int64_t{0}), 1024);
}

TEST(ExDynaAllocate, ZeroAverageMakesNoMoveAndNoDivisionByZero) {
  auto l = ExDynaLayout::Make(kN, 4);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->Allocate({3, 0, 0, 0}, 3), 0);  // int(3 / 4) == 0
  EXPECT_EQ(l->Allocate({0, 0, 0, 0}, 0), 0);
  for (int64_t b : l->blocks()) EXPECT_EQ(b, 256);
}

TEST(ExDyna, CompressorMovesBoundariesFromGatheredCounts) {
  auto prims = MakeCpuPrimitives(1);
  const int nodes = 4;
  // Reference control so the counts are whatever we gather.
  auto c =
      MustMake("exdyna", 0.01, kN, prims.get(), {{"threshold_control", "reference"}}, 0, nodes);
  std::vector<float> acc(kN, 0.0f);
  Selection sel;
  ASSERT_TRUE(c->Select(0, acc.data(), nullptr, false, &sel).ok());
  EXPECT_EQ(sel.scalars[2], 256.0f * 128) << "partition 0 starts with 256 blocks";
  // At step 0 rank r owns partition r: partition 0 heavy, partition 1 light.
  const std::vector<uint64_t> counts{600, 100, 162, 162};
  ASSERT_TRUE(c->Update(0, {counts, {}}).ok());
  // Step 4 (same ownership as step 0): rank 0 owns partition 0, now 255 blocks.
  ASSERT_TRUE(c->Select(4, acc.data(), nullptr, false, &sel).ok());
  EXPECT_EQ(sel.scalars[1], 0.0f);
  EXPECT_EQ(sel.scalars[2], 255.0f * 128);
}

TEST(ExDyna, CountsMapToThePartitionsOwnedAtThatStep) {
  auto prims = MakeCpuPrimitives(1);
  auto c = MustMake("exdyna", 0.01, kN, prims.get(), {{"threshold_control", "reference"}}, 1, 4);
  std::vector<float> acc(kN, 0.0f);
  Selection sel;
  ASSERT_TRUE(c->Select(1, acc.data(), nullptr, false, &sel).ok());
  // At step 1 rank r owns partition (1 + r) mod 4: rank 3 owns partition 0 and rank 0 owns 1.
  const std::vector<uint64_t> counts{100, 162, 162, 600};
  ASSERT_TRUE(c->Update(1, {counts, {}}).ok());
  ASSERT_TRUE(c->Select(2, acc.data(), nullptr, false, &sel).ok());
  // Step 2: rank 1 owns partition 3 (unchanged, 256 blocks); check partition 0 via step 3.
  EXPECT_EQ(sel.scalars[1], 3.0f);
  ASSERT_TRUE(c->Select(3, acc.data(), nullptr, false, &sel).ok());
  EXPECT_EQ(sel.scalars[1], 0.0f);
  EXPECT_EQ(sel.scalars[2], 255.0f * 128) << "partition 0 (heavy) gave a block to partition 1";
}

}  // namespace
}  // namespace spex
