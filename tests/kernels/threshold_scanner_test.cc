// ThresholdScanner's cached and listed answers against fresh counts and direct selects, before
// and after its input changes.
#include "kernels/compressors/threshold_scanner.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

size_t ExactCount(const std::vector<float>& x, float t) {
  size_t c = 0;
  for (float v : x) c += std::fabs(v) >= t;
  return c;
}

// Thresholds from above every entry down to below most of them, in a shuffled order.
std::vector<float> Probes(uint32_t seed) {
  std::vector<float> t = {1e-2f, 5e-3f, 3e-3f, 2e-3f, 1.5e-3f, 1e-3f, 5e-4f, 1e-4f, 1e-6f, 1.0f};
  std::shuffle(t.begin(), t.end(), std::mt19937(seed));
  return t;
}

// Answers from the cached list equal a fresh scanner's (one pass at that threshold) and the
// exact count, whatever order the probes come in and whether the list fits or overflows.
TEST(ThresholdScanner, CachedAnswersEqualFreshOnes) {
  auto prims = MakeCpuPrimitives(1);
  const std::vector<float> x = Laplace(20000, 3);
  for (size_t capacity : {1024u, 4000u, 20000u}) {
    for (uint32_t order = 0; order < 4; ++order) {
      std::vector<float> acc = x;
      ThresholdScanner cached(prims.get(), acc.data(), nullptr, acc.size(), capacity);
      for (float t : Probes(order)) {
        std::vector<float> again = x;
        ThresholdScanner fresh(prims.get(), again.data(), nullptr, again.size(), capacity);
        EXPECT_EQ(cached.Count(t), fresh.Count(t)) << capacity << " " << t;
        EXPECT_EQ(cached.Count(t), ExactCount(x, t)) << capacity << " " << t;
      }
      EXPECT_LE(cached.passes(), 10);
      EXPECT_TRUE(acc == x) << "counting never writes acc";
    }
  }
}

// Once the whole list at a low threshold fits, probes above it make no further pass.
TEST(ThresholdScanner, ProbesAboveTheListedThresholdReuseTheList) {
  auto prims = MakeCpuPrimitives(1);
  std::vector<float> acc = Laplace(20000, 5);
  const std::vector<float> x = acc;
  ThresholdScanner scan(prims.get(), acc.data(), nullptr, acc.size(), acc.size());
  EXPECT_EQ(scan.Count(1e-4f), ExactCount(x, 1e-4f));
  EXPECT_EQ(scan.passes(), 1);
  for (float t : {2e-4f, 1e-3f, 3e-3f, 1e-2f}) EXPECT_EQ(scan.Count(t), ExactCount(x, t)) << t;
  EXPECT_EQ(scan.passes(), 1);
  Selection out;
  scan.Select(2e-3f, false, &out);
  EXPECT_EQ(scan.passes(), 1);
  EXPECT_EQ(out.idx, Above(x, 2e-3f, false));
}

// Select equals the entries at or above t with their values, zeroes exactly those when asked,
// and gives the same selection from the list as from a direct pass.
TEST(ThresholdScanner, SelectFromTheListEqualsADirectSelect) {
  auto prims = MakeCpuPrimitives(1);
  const std::vector<float> x = Laplace(30000, 7);
  for (bool listed : {false, true}) {
    std::vector<float> acc = x;
    ThresholdScanner scan(prims.get(), acc.data(), nullptr, acc.size(), 30000);
    if (listed) scan.Count(1e-4f);  // lists everything >= 1e-4
    Selection out;
    scan.Select(3e-3f, true, &out);
    const std::vector<uint32_t> want = Above(x, 3e-3f, false);
    EXPECT_EQ(out.idx, want) << listed;
    ASSERT_EQ(out.val.size(), want.size());
    for (size_t j = 0; j < want.size(); ++j) EXPECT_EQ(out.val[j], x[want[j]]);
    for (size_t i = 0; i < x.size(); ++i) {
      const bool selected = std::fabs(x[i]) >= 3e-3f;
      EXPECT_EQ(acc[i], selected ? 0.0f : x[i]) << i;
    }
  }
}

// `add` goes into acc with the first pass, and every answer is on acc + add.
TEST(ThresholdScanner, TheFirstPassAddsAdd) {
  auto prims = MakeCpuPrimitives(1);
  std::vector<float> acc = Laplace(10000, 9);
  const std::vector<float> add = Laplace(10000, 10);
  std::vector<float> sum = acc;
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += add[i];
  ThresholdScanner scan(prims.get(), acc.data(), add.data(), acc.size(), 10000);
  EXPECT_EQ(scan.Count(2e-3f), ExactCount(sum, 2e-3f));
  EXPECT_TRUE(acc == sum);
  EXPECT_EQ(scan.Count(1e-3f), ExactCount(sum, 1e-3f));
  EXPECT_EQ(scan.Count(5e-3f), ExactCount(sum, 5e-3f));
  EXPECT_TRUE(acc == sum) << "add is applied once";
}

// A scanner holds nothing beyond its buffer: after the input changes, a new scanner on it
// answers for the new values (no answer of the old list survives).
TEST(ThresholdScanner, AfterTheInputChangesANewScannerAnswersForTheNewValues) {
  auto prims = MakeCpuPrimitives(1);
  std::vector<float> acc = Laplace(20000, 11);
  {
    ThresholdScanner scan(prims.get(), acc.data(), nullptr, acc.size(), acc.size());
    for (float t : Probes(1)) EXPECT_EQ(scan.Count(t), ExactCount(acc, t));
    Selection out;
    scan.Select(2e-3f, true, &out);  // zeroes: the scanner's use ends here
  }
  for (size_t i = 0; i < acc.size(); i += 3) acc[i] *= 4.0f;
  const std::vector<float> x = acc;
  ThresholdScanner scan(prims.get(), acc.data(), nullptr, acc.size(), acc.size());
  for (float t : Probes(2)) {
    std::vector<float> again = x;
    ThresholdScanner fresh(prims.get(), again.data(), nullptr, again.size(), again.size());
    EXPECT_EQ(scan.Count(t), ExactCount(x, t)) << t;
    EXPECT_EQ(scan.Count(t), fresh.Count(t)) << t;
  }
  Selection out;
  scan.Select(2e-3f, false, &out);
  EXPECT_EQ(out.idx, Above(x, 2e-3f, false));
}

}  // namespace
}  // namespace spex
