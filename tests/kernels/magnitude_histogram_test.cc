// MagnitudeHistogram against direct counts: BuildFrom equals BuildAt above the floor, FloorOfTop
// holds at least k and is the highest such bin, a rebuild counts the new values.
#include "kernels/compressors/magnitude_histogram.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

size_t ExactCount(const std::vector<float>& x, float t) {
  size_t c = 0;
  for (float v : x) c += std::fabs(v) >= t;
  return c;
}

// BuildFrom(floor) bounds every threshold in floor's bin or above exactly as Build does, and
// says when it was asked below (with a loose but true bound).
TEST(MagnitudeHistogram, BuildFromEqualsBuildAtAndAboveTheFloor) {
  auto prims = MakeCpuPrimitives(1);
  const std::vector<float> x = Laplace(40000, 21);
  MagnitudeHistogram full, part;
  full.Build(prims.get(), x.data(), x.size());
  part.BuildFrom(prims.get(), x.data(), x.size(), 1e-3f);
  for (float t : {1e-3f, 1.5e-3f, 4e-3f, 1e-2f, 1e-1f}) {
    size_t lo_f, hi_f, lo_p, hi_p;
    full.Bounds(t, &lo_f, &hi_f);
    part.Bounds(t, &lo_p, &hi_p);
    EXPECT_EQ(lo_f, lo_p) << t;
    EXPECT_EQ(hi_f, hi_p) << t;
  }
  EXPECT_FALSE(part.missed());
  size_t lo, hi;
  part.Bounds(1e-4f, &lo, &hi);
  EXPECT_TRUE(part.missed());
  EXPECT_LE(lo, ExactCount(x, 1e-4f));
  EXPECT_EQ(hi, x.size());
  part.BuildFrom(prims.get(), x.data(), x.size(), 1e-3f);
  EXPECT_FALSE(part.missed()) << "a build clears missed()";
}

// FloorOfTop(k): at least k entries lie at or above it, and fewer than k lie above the next bin
// up; 0 when k exceeds the finite non-NaN population counted.
TEST(MagnitudeHistogram, FloorOfTopHoldsAtLeastKAndIsTheHighestSuchBin) {
  auto prims = MakeCpuPrimitives(1);
  std::vector<float> x = Laplace(30000, 22);
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[1] = std::numeric_limits<float>::infinity();
  MagnitudeHistogram h;
  h.Build(prims.get(), x.data(), x.size());
  for (size_t k : {1u, 10u, 300u, 3000u, 29000u}) {
    const float f = h.FloorOfTop(k);
    ASSERT_GT(f, 0.0f) << k;
    EXPECT_GE(ExactCount(x, f) - 1, k) << k << " (less the Inf, which no finite bin holds)";
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    bits += 1u << 15;  // the lower edge of the next bin up
    float next;
    std::memcpy(&next, &bits, sizeof(next));
    EXPECT_LT(ExactCount(x, next) - 1, k) << k << ": the bin above holds fewer than k";
  }
  EXPECT_EQ(h.FloorOfTop(0), 0.0f);
  EXPECT_EQ(h.FloorOfTop(x.size()), 0.0f) << "the NaN and Inf are not finite entries";
}

// Rebuilding on changed input forgets the old counts.
TEST(MagnitudeHistogram, ARebuildCountsTheNewValues) {
  auto prims = MakeCpuPrimitives(1);
  std::vector<float> x = Laplace(20000, 23);
  MagnitudeHistogram h;
  h.Build(prims.get(), x.data(), x.size());
  for (float& v : x) v *= 8.0f;
  h.Build(prims.get(), x.data(), x.size());
  for (float t : {1e-3f, 8e-3f, 3e-2f}) {
    size_t lo, hi;
    h.Bounds(t, &lo, &hi);
    EXPECT_LE(lo, ExactCount(x, t)) << t;
    EXPECT_GE(hi, ExactCount(x, t)) << t;
    EXPECT_LE(hi - lo, 1 + x.size() / 50) << t;
  }
}

}  // namespace
}  // namespace spex
