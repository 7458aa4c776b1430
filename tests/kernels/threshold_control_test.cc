// HistogramQuotaSelect on inputs where many magnitudes tie (constant, all-zero, few distinct
// values, one huge entry over a constant rest) and on heavy-tailed data: the selection must be the
// exact top-quota by |x| with ties toward the lower index, as the AppendAbove + TrimTopK path
// has always kept it (issue 12: the tie-heavy inputs now take a path of their own).
#include "kernels/compressors/threshold_control.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

// Straightforward reference: indices of [begin, end) stably sorted by |x| descending (ties: lower
// index first), non-zero ones only, the first `quota` of them, ascending.
std::vector<uint32_t> ReferenceTop(const std::vector<float>& x, size_t begin, size_t end,
                                   size_t quota) {
  std::vector<uint32_t> order;
  for (size_t i = begin; i < end; ++i) {
    if (x[i] != 0.0f) order.push_back(static_cast<uint32_t>(i));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(std::min(order.size(), quota));
  std::sort(order.begin(), order.end());
  return order;
}

void ExpectTop(const std::vector<float>& x, size_t begin, size_t end, size_t quota, int threads) {
  auto prims = MakeCpuPrimitives(threads);
  std::vector<uint32_t> bins;
  Selection out;
  out.idx = {7};  // an earlier part's entry stays in front
  out.val = {0.5f};
  const float t = HistogramQuotaSelect(prims.get(), x.data(), begin, end, quota, true, &bins, &out);
  const std::vector<uint32_t> want = ReferenceTop(x, begin, end, quota);
  ASSERT_EQ(out.idx.size(), want.size() + 1);
  EXPECT_EQ(out.idx[0], 7u);
  float smallest = std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < want.size(); ++j) {
    ASSERT_EQ(out.idx[j + 1], want[j]) << "position " << j;
    ASSERT_EQ(out.val[j + 1], x[want[j]]) << "position " << j;
    smallest = std::min(smallest, std::fabs(x[want[j]]));
  }
  // The applied threshold: the smallest kept magnitude after a trim, else the edge bin's lower end.
  EXPECT_LE(t, smallest);
  EXPECT_GT(t, 0.0f);
}

constexpr size_t kN = 200003;

std::vector<float> Distinct(size_t n, uint32_t values, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> x(n);
  for (float& v : x) v = 1e-3f * static_cast<float>(1 + gen() % values) * (gen() % 2 ? 1 : -1);
  return x;
}

TEST(HistogramQuotaSelect, ConstantTakesTheLowestIndices) {
  const std::vector<float> x(kN, 1e-3f);
  for (int threads : {1, 2}) {
    ExpectTop(x, 0, kN, 1000, threads);
    ExpectTop(x, 12345, 150001, 777, threads);
  }
}

TEST(HistogramQuotaSelect, ConstantWithMixedSigns) {
  std::vector<float> x(kN, 2.5f);
  for (size_t i = 0; i < kN; i += 3) x[i] = -2.5f;
  ExpectTop(x, 0, kN, 4096, 1);
}

TEST(HistogramQuotaSelect, AllZeroSelectsNothing) {
  const std::vector<float> x(kN, 0.0f);
  auto prims = MakeCpuPrimitives(1);
  std::vector<uint32_t> bins;
  Selection out;
  EXPECT_EQ(HistogramQuotaSelect(prims.get(), x.data(), 0, kN, 100, true, &bins, &out),
            std::numeric_limits<float>::infinity());
  EXPECT_TRUE(out.idx.empty());
}

TEST(HistogramQuotaSelect, FewDistinctValues) {
  for (uint32_t values : {2u, 3u, 16u}) {
    const std::vector<float> x = Distinct(kN, values, values);
    for (size_t quota : {1u, 100u, 5000u, 60000u}) {
      SCOPED_TRACE(testing::Message() << values << " values, quota " << quota);
      ExpectTop(x, 0, kN, quota, 1);
      ExpectTop(x, 99, kN - 5, quota, 2);
    }
  }
}

// Several magnitudes per histogram bin, each repeated many times: the trim ranks only the edge
// bin's candidates (TrimAtEdgeBin), which must keep exactly the reference's top, ties toward the
// lower index included, at every quota (an edge bin cut anywhere: at a tie, between magnitudes).
TEST(HistogramQuotaSelect, EdgeBinWithManyMagnitudesAndTies) {
  for (uint32_t values : {600u, 3000u, 40000u}) {
    const std::vector<float> x = Distinct(kN, values, values + 1);
    for (size_t quota : {1u, 37u, 1000u, 4999u, 20011u, 90000u}) {
      SCOPED_TRACE(testing::Message() << values << " values, quota " << quota);
      ExpectTop(x, 0, kN, quota, 1);
      ExpectTop(x, 17, kN - 3, quota, 2);
    }
  }
}

TEST(HistogramQuotaSelect, OneHugeOverAConstantRest) {
  for (size_t huge_at : {size_t{0}, size_t{5}, kN / 2, kN - 1}) {
    std::vector<float> x(kN, 1e-3f);
    x[huge_at] = 1e6f;
    SCOPED_TRACE(huge_at);
    ExpectTop(x, 0, kN, 1000, 1);
    ExpectTop(x, 0, kN, 1, 1);
  }
}

TEST(HistogramQuotaSelect, SeveralHigherEntriesAfterTheEdgeBin) {
  // Higher entries spread after the edge bin's chosen entries: they come from the second scan.
  std::vector<float> x(kN, 1e-3f);
  for (size_t i = 1000; i < kN; i += 997) x[i] = 5e-3f * static_cast<float>(1 + i % 7);
  ExpectTop(x, 0, kN, 300, 1);
  ExpectTop(x, 0, kN, 2000, 2);
}

TEST(HistogramQuotaSelect, NearlyConstantEdgeBinFallsBack) {
  // The edge bin holds two magnitudes one ulp apart: not a single magnitude, the general path.
  std::vector<float> x(kN, 1e-3f);
  for (size_t i = 0; i < kN; i += 5) x[i] = std::nextafter(1e-3f, 1.0f);
  ExpectTop(x, 0, kN, 1000, 1);
  ExpectTop(x, 0, kN, 60000, 1);
}

TEST(HistogramQuotaSelect, HeavyTailedUnchanged) {
  const std::vector<float> x = Laplace(kN, 5);
  for (size_t quota : {1u, 200u, 2000u}) ExpectTop(x, 0, kN, quota, 1);
}

TEST(HistogramQuotaSelect, RampsHaveManyMagnitudesPerBin) {
  std::vector<float> up(kN), down(kN);
  for (size_t i = 0; i < kN; ++i) {
    up[i] = static_cast<float>(i + 1) / kN;
    down[i] = static_cast<float>(kN - i) / kN;
  }
  ExpectTop(up, 0, kN, 2000, 1);
  ExpectTop(down, 0, kN, 2000, 1);
}

// The edge hint (what micro and exdyna pass: the previous selection's edge bin) changes nothing
// but the work: with a hint at the edge, far above it (the counted bins hold fewer than the
// quota: a second count from lower down, or the full histogram), far below it, and 0, the selection
// and the applied threshold equal the hint-less ones, and the hint comes back as the edge bin.
TEST(HistogramQuotaSelect, EdgeHintChangesNothingButTheWork) {
  const std::vector<float> x = Laplace(kN, 9);
  auto prims = MakeCpuPrimitives(1);
  for (size_t quota : {1u, 200u, 2000u, 50000u}) {
    SCOPED_TRACE(quota);
    std::vector<uint32_t> bins;
    Selection want;
    const float t =
        HistogramQuotaSelect(prims.get(), x.data(), 10, kN - 10, quota, true, &bins, &want);
    uint32_t edge = 0;
    Selection first;
    EXPECT_EQ(HistogramQuotaSelect(prims.get(), x.data(), 10, kN - 10, quota, true, &bins, &first,
                                   nullptr, &edge),
              t);
    EXPECT_EQ(first.idx, want.idx);
    ASSERT_GT(edge, 128u);  // so that every hint below is above the margin or 1
    const uint32_t returned = edge;
    // returned, up to 16 bins above it and 10 below: the count from 32 bins below the hint finds
    // the edge; returned + 100 and + 250: the count from the hint falls short and the one from 256
    // bins lower (a factor 4 in magnitude) finds the edge; + 1000 and 0xFF00: the full count.
    for (uint32_t hint :
         {returned, returned + 5, returned + 15, returned + 16, returned - 10, returned + 100,
          returned + 250, returned + 1000, 0xFF00u, returned - 100, 200u, 1u}) {
      SCOPED_TRACE(hint);
      uint32_t h = hint;
      Selection got;
      EXPECT_EQ(HistogramQuotaSelect(prims.get(), x.data(), 10, kN - 10, quota, true, &bins, &got,
                                     nullptr, &h),
                t);
      EXPECT_EQ(got.idx, want.idx);
      EXPECT_EQ(got.val, want.val);
      EXPECT_EQ(h, returned);
    }
  }
}

// Ties at the edge under a hint: 300 entries of one magnitude (in the edge bin, a quota of 200)
// among small ones; with a hint at, above or below the edge the cut is the hint-less one (the
// first 200 of the tied entries in index order), with the same threshold.
TEST(HistogramQuotaSelect, HintedSelectionCutsTiesLikeTheHintless) {
  std::vector<float> x = Laplace(kN, 11, 1e-4f);
  for (size_t i = 0; i < 300; ++i) x[(i * 7919) % kN] = (i % 2 ? -0.5f : 0.5f);
  auto prims = MakeCpuPrimitives(1);
  std::vector<uint32_t> bins;
  Selection want;
  uint32_t edge = 0;
  const float t =
      HistogramQuotaSelect(prims.get(), x.data(), 0, kN, 200, true, &bins, &want, nullptr, &edge);
  ASSERT_EQ(want.idx.size(), 200u);
  for (uint32_t hint : {edge, edge + 10, edge - 10}) {
    SCOPED_TRACE(hint);
    uint32_t h = hint;
    Selection got;
    EXPECT_EQ(
        HistogramQuotaSelect(prims.get(), x.data(), 0, kN, 200, true, &bins, &got, nullptr, &h), t);
    EXPECT_EQ(got.idx, want.idx);
    EXPECT_EQ(got.val, want.val);
    EXPECT_EQ(h, edge);
  }
}

// Bins counted before the selection (the local sum's, `counted_from`): from any bin at or below
// +Inf's, whether the edge lies above the counted bins' start (walked only) or below it (counted
// again from lower), the selection, the threshold and the hint left are those of the selection
// that counts for itself. A start past 0xFF00 is no count: the bins are counted afresh (they hold
// garbage here).
TEST(HistogramQuotaSelect, BinsCountedBeforeChangeNothingButTheWork) {
  const std::vector<float> x = Laplace(kN, 13);
  auto prims = MakeCpuPrimitives(1);
  for (size_t quota : {1u, 2000u, 50000u}) {
    SCOPED_TRACE(quota);
    std::vector<uint32_t> bins;
    Selection want;
    uint32_t edge = 0;
    const float t = HistogramQuotaSelect(prims.get(), x.data(), 10, kN - 10, quota, true, &bins,
                                         &want, nullptr, &edge);
    ASSERT_GT(edge, 400u);
    for (uint32_t from : {0u, 1u, edge - 300, edge - 100, edge - 1, edge, edge + 1, edge + 40,
                          edge + 300, 0xFF00u, 0xFF01u, kNotCounted}) {
      SCOPED_TRACE(from);
      std::vector<uint32_t> counted(Primitives::kHistogramBins, from > 0xFF00u ? 77u : 0u);
      if (from <= 0xFF00u) prims->AbsHistogram16From(x.data(), 10, kN - 10, from, counted.data());
      uint32_t h = edge + 7;  // a hint that disagrees with the counted start
      Selection got;
      EXPECT_EQ(HistogramQuotaSelect(prims.get(), x.data(), 10, kN - 10, quota, true, &counted,
                                     &got, nullptr, &h, from),
                t);
      EXPECT_EQ(got.idx, want.idx);
      EXPECT_EQ(got.val, want.val);
      EXPECT_EQ(h, edge);
    }
  }
}

}  // namespace
}  // namespace spex
