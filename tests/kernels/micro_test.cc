// MiCRO: equal partitions, exclusive and cyclic ownership, selections confined to the owned
// partition, the published controller's factors and threshold sequence on crafted gathered
// counts (single node counts locally), and the histogram quota (exact with trim, at most one
// bin over without).
#include "kernels/compressors/micro.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "kernels/compressors/threshold_control.h"
#include "kernels/cpu/cpu_primitives.h"
#include "tests/kernels/compressor_test_util.h"
#include "tests/support/forwarding_primitives.h"

namespace spex {
namespace {

TEST(MicroPartition, EqualPartitionsTileTheVector) {
  for (size_t n : {1u, 7u, 1000u, 11173962u}) {
    for (int parts : {1, 3, 4, 16}) {
      size_t expect_begin = 0;
      for (int j = 0; j < parts; ++j) {
        const Range r = EqualPartition(n, parts, j);
        EXPECT_EQ(r.begin, expect_begin);
        EXPECT_EQ(r.size(), n / parts + (static_cast<size_t>(j) < n % parts ? 1 : 0));
        expect_begin = r.end;
      }
      EXPECT_EQ(expect_begin, n);
    }
  }
}

TEST(MicroOwnership, ExclusiveEveryStepAndCyclic) {
  for (int nodes : {1, 2, 4, 7}) {
    std::vector<std::set<int>> visited(nodes);
    for (uint64_t step = 0; step < 3 * static_cast<uint64_t>(nodes); ++step) {
      std::set<int> owned;
      for (int r = 0; r < nodes; ++r) {
        const int p = OwnedPartition(step, r, nodes);
        EXPECT_EQ(p, static_cast<int>((step % nodes + r) % nodes));
        owned.insert(p);
        visited[r].insert(p);
        EXPECT_EQ(p, OwnedPartition(step + nodes, r, nodes)) << "period must be the node count";
        if (nodes > 1) {
          EXPECT_NE(p, OwnedPartition(step + 1, r, nodes)) << "ownership must move";
        }
      }
      EXPECT_EQ(owned.size(), static_cast<size_t>(nodes)) << "two nodes own one partition";
    }
    for (int r = 0; r < nodes; ++r) EXPECT_EQ(visited[r].size(), static_cast<size_t>(nodes));
  }
}

TEST(Micro, SelectsOnlyInsideTheOwnedPartition) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 100003;
  const int nodes = 4;
  for (const char* control : {"histogram", "reference"}) {
    for (int r = 0; r < nodes; ++r) {
      auto c = MustMake("micro", 0.01, n, prims.get(), {{"threshold_control", control}}, r, nodes);
      std::vector<float> acc(n, 0.0f);
      for (uint64_t step = 0; step < 6; ++step) {
        const std::vector<float> g = Laplace(n, static_cast<uint32_t>(step * 10 + r), 0.01f);
        Selection sel;
        ASSERT_TRUE(c->Select(step, acc.data(), g.data(), false, &sel).ok());
        const Range own = EqualPartition(n, nodes, OwnedPartition(step, r, nodes));
        ASSERT_FALSE(sel.idx.empty());
        EXPECT_GE(sel.idx.front(), own.begin) << control;
        EXPECT_LT(sel.idx.back(), own.end) << control;
        EXPECT_EQ(sel.scalars[1], static_cast<float>(OwnedPartition(step, r, nodes)));
        const std::vector<uint64_t> counts(nodes, sel.idx.size());
        ASSERT_TRUE(c->Update(step, {counts, sel.idx}).ok());
      }
    }
  }
}

TEST(MicroReferenceControl, ScaleFactorsAtTheBandEdges) {
  EXPECT_EQ(ReferenceScaleFactor(2.0), 1.005);
  EXPECT_EQ(ReferenceScaleFactor(1.1000001), 1.005);
  EXPECT_EQ(ReferenceScaleFactor(1.1), 1.00125) << "1.1 itself is in the band (in-band creep)";
  EXPECT_EQ(ReferenceScaleFactor(1.0), 1.00125);
  EXPECT_EQ(ReferenceScaleFactor(0.95), 1.00125);
  EXPECT_EQ(ReferenceScaleFactor(1.0 / 1.1), 0.995);
  EXPECT_EQ(ReferenceScaleFactor(0.5), 0.995);
  EXPECT_EQ(ReferenceScaleFactor(0.0), 0.995);
  EXPECT_NEAR(InitialThreshold(11173), 4.73e-3, 1e-5);  // ResNet-18: k = 11173 at d = 0.001
}

TEST(MicroReferenceControl, ThresholdFollowsGatheredCounts) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 200000;
  const int nodes = 2;
  auto c = MustMake("micro", 0.001, n, prims.get(), {{"threshold_control", "reference"}}, 0, nodes);
  const size_t k = 200;
  std::vector<float> acc(n, 0.0f);
  Selection sel;
  // Gathered totals of each step and the factor the next step must apply.
  const uint64_t totals[] = {500, 200, 221, 220, 182, 181, 0};
  const double factors[] = {1.005, 1.00125, 1.005, 1.00125, 1.00125, 0.995, 0.995};
  double th = 1.0 / (2.0 * std::sqrt(static_cast<double>(k)));
  for (int step = 0; step < 7; ++step) {
    ASSERT_TRUE(c->Select(step, acc.data(), nullptr, false, &sel).ok());
    EXPECT_FLOAT_EQ(sel.scalars[0], static_cast<float>(th)) << "step " << step;
    const std::vector<uint64_t> counts{totals[step] / 2, totals[step] - totals[step] / 2};
    ASSERT_TRUE(c->Update(step, {counts, {}}).ok());
    th = static_cast<float>(static_cast<float>(th) * factors[step]);
  }
}

TEST(MicroReferenceControl, SingleNodeCountsItsOwnSelections) {
  // The reference's n = 1 bug: k_prev stays 0, so the threshold decays forever. Here the
  // gathered count is the node's own: on target, the threshold creeps up instead.
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 10000;
  auto c = MustMake("micro", 0.01, n, prims.get(), {{"threshold_control", "reference"}});
  std::vector<float> acc(n);
  const float th0 = InitialThreshold(100);
  for (size_t i = 0; i < n; ++i) acc[i] = i < 100 ? 2 * th0 : th0 / 2;  // exactly k above
  Selection sel;
  ASSERT_TRUE(c->Select(0, acc.data(), nullptr, false, &sel).ok());
  ASSERT_EQ(sel.idx.size(), 100u);
  const std::vector<uint64_t> own{sel.idx.size()};
  ASSERT_TRUE(c->Update(0, {own, sel.idx}).ok());
  ASSERT_TRUE(c->Select(1, acc.data(), nullptr, false, &sel).ok());
  EXPECT_GT(sel.scalars[0], th0);
}

TEST(MicroHistogramControl, QuotaExactWithTrimAndWithinOneBinWithout) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 400000;
  const int nodes = 4;
  for (double d : {0.001, 0.01}) {
    const size_t k = static_cast<size_t>(d * n);
    for (int r = 0; r < nodes; ++r) {
      const std::vector<float> x = Normal(n, 40 + r);
      const Range own = EqualPartition(n, nodes, OwnedPartition(0, r, nodes));
      const size_t quota = EvenShare(k, nodes, OwnedPartition(0, r, nodes));
      std::vector<float> acc = x;
      auto trimmed = MustMake("micro", d, n, prims.get(), {}, r, nodes);
      Selection sel;
      ASSERT_TRUE(trimmed->Select(0, acc.data(), nullptr, false, &sel).ok());
      EXPECT_EQ(sel.idx.size(), quota);
      // The kept set is the exact top-quota of the partition.
      std::vector<float> mags;
      for (size_t i = own.begin; i < own.end; ++i) mags.push_back(std::fabs(x[i]));
      std::nth_element(mags.begin(), mags.begin() + (quota - 1), mags.end(), std::greater<float>());
      for (float v : sel.val) EXPECT_GE(std::fabs(v), mags[quota - 1]);

      auto plain = MustMake("micro", d, n, prims.get(), {{"histogram_trim", "false"}}, r, nodes);
      ASSERT_TRUE(plain->Select(0, acc.data(), nullptr, false, &sel).ok());
      ASSERT_GE(sel.idx.size(), quota);
      // Every selected entry is >= the edge; the overshoot is the edge bin's population.
      uint32_t edge_bits;
      std::memcpy(&edge_bits, &sel.scalars[0], 4);
      const uint32_t bin = edge_bits >> 15;
      size_t in_bin = 0;
      for (size_t i = own.begin; i < own.end; ++i) {
        uint32_t b;
        std::memcpy(&b, &x[i], 4);
        in_bin += ((b & 0x7fffffffu) >> 15) == bin;
      }
      EXPECT_LT(sel.idx.size() - quota, in_bin) << "overshoot beyond one bin";
      for (float v : sel.val) EXPECT_GE(std::fabs(v), sel.scalars[0]);
    }
  }
}

// Counts the passes over the bucket: histograms and selects that read inside [lo, hi).
class CountingPrimitives : public test::ForwardingPrimitives {
 public:
  CountingPrimitives() : ForwardingPrimitives(MakeCpuPrimitives(1)) {}
  void AbsHistogram16(const float* x, size_t begin, size_t end, uint32_t* bins) override {
    Count(x);
    inner()->AbsHistogram16(x, begin, end, bins);
  }
  void AbsHistogram16From(const float* x, size_t begin, size_t end, uint32_t first_bin,
                          uint32_t* bins) override {
    Count(x);
    inner()->AbsHistogram16From(x, begin, end, first_bin, bins);
  }
  size_t SelectAbove(float* x, size_t begin, size_t end, float t, bool zero, uint32_t* idx,
                     float* val, size_t capacity) override {
    Count(x);
    return inner()->SelectAbove(x, begin, end, t, zero, idx, val, capacity);
  }
  // The sum's own pass (it writes acc; counting its histogram is no pass of its own).
  absl::Status SumScaledCheckFiniteHistogram(float* y, const float* const* xs, int count, float a,
                                             size_t n, size_t* first_bad,
                                             const HistogramRange& h) override {
    return inner()->SumScaledCheckFiniteHistogram(y, xs, count, a, n, first_bad, h);
  }
  void Count(const float* x) { passes += x >= lo && x < hi; }
  const float* lo = nullptr;
  const float* hi = nullptr;
  int passes = 0;
};

// The owned partition alternates between steps, and partitions can differ in scale by orders of
// magnitude (a bucket's layers): each partition's own last edge is the hint, so once every
// partition was selected, a step reads the partition twice (the count from just below the hint,
// then the select). A hint left by the other partition took four passes when it lay far above
// the edge (the count from it, from 256 bins lower, of all bins, then the select). The selections
// are those of a fresh compressor with no hint.
TEST(MicroHistogramControl, EachPartitionKeepsItsOwnEdgeHint) {
  const size_t n = 200000;
  const int nodes = 2;
  CountingPrimitives counting;
  auto cpu = MakeCpuPrimitives(1);
  auto c = MustMake("micro", 0.1, n, &counting, {}, 0, nodes);
  for (uint64_t step = 0; step < 8; ++step) {
    std::vector<float> acc = Laplace(n, static_cast<uint32_t>(step + 1), 1.0f);
    for (size_t i = 0; i < n / 2; ++i) acc[i] *= 1e-6f;  // partition 0: 2^-20 the scale
    Selection sel;
    counting.lo = acc.data();
    counting.hi = acc.data() + n;
    counting.passes = 0;
    ASSERT_TRUE(c->Select(step, acc.data(), nullptr, false, &sel).ok());
    if (step >= static_cast<uint64_t>(nodes)) {
      EXPECT_EQ(counting.passes, 2) << "step " << step;
    }
    auto fresh = MustMake("micro", 0.1, n, cpu.get(), {}, 0, nodes);
    Selection want;
    ASSERT_TRUE(fresh->Select(step, acc.data(), nullptr, false, &want).ok());
    EXPECT_EQ(sel.idx, want.idx) << "step " << step;
    EXPECT_EQ(sel.val, want.val) << "step " << step;
    ASSERT_TRUE(c->Update(step, {std::vector<uint64_t>(nodes, sel.idx.size()), sel.idx}).ok());
  }
}

// The local sum counts the owned partition's histogram as it writes acc (PlanSumHistogram, as the
// engine's CPU path does), so once every partition has its hint a step reads the partition once:
// the select. The selections are those of a compressor given the same acc without a plan. A plan
// not marked counted, one for another step, or a Select with `add` (acc changes after the sum)
// is not used: the partition is counted again (two passes), with the same selections.
TEST(MicroHistogramControl, TheSumsHistogramSavesThePartitionsCount) {
  const size_t n = 200000;
  const int nodes = 2;
  CountingPrimitives counting;
  auto cpu = MakeCpuPrimitives(1);
  auto c = MustMake("micro", 0.1, n, &counting, {}, 1, nodes);
  auto plain = MustMake("micro", 0.1, n, cpu.get(), {}, 1, nodes);
  std::vector<float> residual(n, 0.0f), acc(n), zeros(n, 0.0f);
  for (uint64_t step = 0; step < 10; ++step) {
    std::vector<float> g0 = Laplace(n, static_cast<uint32_t>(2 * step + 1), 1.0f);
    std::vector<float> g1 = Laplace(n, static_cast<uint32_t>(2 * step + 2), 1.0f);
    for (size_t i = 0; i < n / 2; ++i) g0[i] *= 1e-4f;  // partitions of different scales
    const float* xs[3] = {residual.data(), g0.data(), g1.data()};
    // Step 6: a plan left uncounted; step 7: one counted, but for the next step.
    SumHistogram* plan = c->PlanSumHistogram(step == 7 ? step + 1 : step);
    ASSERT_NE(plan, nullptr);
    size_t bad = 0;
    ASSERT_TRUE(
        counting.SumScaledCheckFiniteHistogram(acc.data(), xs, 3, 1.0f, n, &bad, plan->range).ok());
    plan->counted = step != 6;
    ASSERT_EQ(bad, n);
    std::vector<float> same = acc;
    counting.lo = acc.data();
    counting.hi = acc.data() + n;
    counting.passes = 0;
    Selection sel, want;
    // Step 8: the same acc reached through `add` (zeros): the sum's counts are not used.
    ASSERT_TRUE(c->Select(step, acc.data(), step == 8 ? zeros.data() : nullptr, false, &sel).ok());
    if (step >= static_cast<uint64_t>(nodes)) {
      const bool fused = step != 6 && step != 7 && step != 8;
      EXPECT_EQ(counting.passes, fused ? 1 : 2) << "step " << step;
    }
    ASSERT_TRUE(plain->Select(step, same.data(), nullptr, false, &want).ok());
    EXPECT_EQ(sel.idx, want.idx) << "step " << step;
    EXPECT_EQ(sel.val, want.val) << "step " << step;
    EXPECT_EQ(sel.scalars[0], want.scalars[0]) << "step " << step;
    const std::vector<uint64_t> counts(nodes, sel.idx.size());
    ASSERT_TRUE(c->Update(step, {counts, sel.idx}).ok());
    ASSERT_TRUE(plain->Update(step, {counts, sel.idx}).ok());
    // Error feedback as the engine keeps it: the residual is acc less what was sent.
    residual = acc;
    for (uint32_t i : sel.idx) residual[i] = 0.0f;
  }
}

}  // namespace
}  // namespace spex
