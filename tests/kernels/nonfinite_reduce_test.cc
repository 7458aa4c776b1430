// The detecting local reduce (Primitives::SumScaledCheckFinite, issue 16 item 3): the same sums
// as SumScaled bit for bit, and the lowest index whose result is NaN or +-Inf, on the fused CPU
// path (1 and 2 threads, every position in a SIMD vector and the scalar tail, and large outputs
// written with streaming stores) and the reference's default (SumScaled plus a scan).
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_primitives.h"
#include "kernels/primitives.h"
#include "kernels/reference/reference_primitives.h"

namespace spex {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> Ramp(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + 0.001f * static_cast<float>(i % 977);
  return v;
}

// Runs SumScaledCheckFinite on three inputs with `bad` written at `where` in input `which`,
// checks the result against SumScaled of the same inputs and returns first_bad.
size_t Check(Primitives& p, size_t n, int which, size_t where, float bad) {
  std::vector<std::vector<float>> in = {Ramp(n, 1.0f), Ramp(n, -0.5f), Ramp(n, 0.25f)};
  if (which >= 0) in[which][where] = bad;
  const float* xs[3] = {in[0].data(), in[1].data(), in[2].data()};
  std::vector<float> y(n, 7.0f), want(n, 7.0f);
  size_t first_bad = 12345;
  EXPECT_TRUE(p.SumScaledCheckFinite(y.data(), xs, 3, 0.5f, n, &first_bad).ok());
  EXPECT_TRUE(p.SumScaled(want.data(), xs, 3, 0.5f, n).ok());
  for (size_t i = 0; i < n; ++i) {
    const bool same = std::memcmp(&y[i], &want[i], sizeof(float)) == 0 ||
                      (std::isnan(y[i]) && std::isnan(want[i]));
    EXPECT_TRUE(same) << "n=" << n << " i=" << i;
    if (!same) break;
  }
  return first_bad;
}

class NonfiniteReduceTest : public testing::TestWithParam<int> {
 protected:
  std::unique_ptr<Primitives> Make() {
    return GetParam() == 0 ? MakeReferencePrimitives() : MakeCpuPrimitives(GetParam());
  }
};

TEST_P(NonfiniteReduceTest, AllFiniteReportsN) {
  auto p = Make();
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1000}, size_t{600000}}) {
    EXPECT_EQ(Check(*p, n, -1, 0, 0.0f), n);
  }
}

TEST_P(NonfiniteReduceTest, FindsNaNAndInfAtEveryLanePositionAndTail) {
  auto p = Make();
  const size_t n = 1000 + 13;  // a scalar tail for every vector width
  for (float bad : {kNaN, kInf, -kInf}) {
    for (size_t where : {size_t{0}, size_t{1}, size_t{3}, size_t{7}, size_t{15}, size_t{16},
                         size_t{500}, n - 14, n - 1}) {
      EXPECT_EQ(Check(*p, n, static_cast<int>(where % 3), where, bad), where)
          << "bad=" << bad << " where=" << where;
    }
  }
}

TEST_P(NonfiniteReduceTest, LowestIndexAcrossThreadChunks) {
  auto p = Make();
  const size_t n = 600000;  // above kCpuParallelMinElements: several chunks with 2 threads
  std::vector<std::vector<float>> in = {Ramp(n, 1.0f), Ramp(n, 2.0f)};
  in[1][n - 5] = kNaN;
  in[0][400001] = -kInf;
  in[1][300007] = kInf;
  const float* xs[2] = {in[0].data(), in[1].data()};
  std::vector<float> y(n);
  size_t first_bad = 0;
  ASSERT_TRUE(p->SumScaledCheckFinite(y.data(), xs, 2, 1.0f, n, &first_bad).ok());
  EXPECT_EQ(first_bad, 300007u);
  EXPECT_TRUE(std::isinf(y[300007]) && std::isinf(y[400001]) && std::isnan(y[n - 5]));
}

// The CPU loop tests a whole block of vectors at once and rescans a bad block: the lowest index
// when a block holds several bad values in different vectors and lanes, and a later bad block
// does not replace it.
TEST_P(NonfiniteReduceTest, LowestOfSeveralInOneBlock) {
  auto p = Make();
  const size_t n = 4096 + 5;
  std::vector<std::vector<float>> in = {Ramp(n, 1.0f), Ramp(n, 2.0f)};
  in[0][2100] = kNaN;  // same block as the two below at every vector width
  in[1][2053] = kInf;
  in[0][2051] = -kInf;
  in[1][3000] = kNaN;
  const float* xs[2] = {in[0].data(), in[1].data()};
  std::vector<float> y(n);
  size_t first_bad = 0;
  ASSERT_TRUE(p->SumScaledCheckFinite(y.data(), xs, 2, 1.0f, n, &first_bad).ok());
  EXPECT_EQ(first_bad, 2051u);
  EXPECT_TRUE(std::isinf(y[2051]) && std::isinf(y[2053]) && std::isnan(y[2100]) &&
              std::isnan(y[3000]));
  EXPECT_EQ(y[2052], in[0][2052] + in[1][2052]);
}

TEST_P(NonfiniteReduceTest, InfMinusInfAndOverflowAreNonFinite) {
  auto p = Make();
  std::vector<float> a = {1.0f, kInf, 3e38f, 2.0f};
  std::vector<float> b = {1.0f, -kInf, 3e38f, 2.0f};
  const float* xs[2] = {a.data(), b.data()};
  std::vector<float> y(4);
  size_t first_bad = 0;
  ASSERT_TRUE(p->SumScaledCheckFinite(y.data(), xs, 2, 1.0f, 4, &first_bad).ok());
  EXPECT_EQ(first_bad, 1u);       // +Inf + -Inf is NaN
  EXPECT_TRUE(std::isinf(y[2]));  // 6e38 overflows, as a dense all-reduce's sum would
}

// Past 2 MiB of output the CPU path streams it (kStreamBytes) (non-temporal stores after a scalar
// head up to the first vector-aligned entry, per thread chunk): the same sums, and the same first
// index whether the bad value lands in a head, a body or the tail.
TEST_P(NonfiniteReduceTest, LargeStreamedOutputsGiveTheSameSumsAndIndex) {
  if (GetParam() == 0) GTEST_SKIP() << "the reference does not stream";
  auto p = Make();
  const size_t n = (size_t{2} << 20) / sizeof(float) + 4099;
  std::vector<std::vector<float>> in = {Ramp(n, 1.0f), Ramp(n, -0.5f)};
  const float* xs[2] = {in[0].data(), in[1].data()};
  std::vector<float> y(n, 7.0f), want(n, 7.0f);
  size_t first_bad = 0;
  ASSERT_TRUE(p->SumScaledCheckFinite(y.data(), xs, 2, 0.5f, n, &first_bad).ok());
  ASSERT_TRUE(p->SumScaled(want.data(), xs, 2, 0.5f, n).ok());
  EXPECT_EQ(first_bad, n);
  EXPECT_EQ(std::memcmp(y.data(), want.data(), n * sizeof(float)), 0);
  // SumScaled streams past 2 MiB as well: the same sums as the reference's plain loop.
  std::vector<float> ref(n, 7.0f);
  ASSERT_TRUE(MakeReferencePrimitives()->SumScaled(ref.data(), xs, 2, 0.5f, n).ok());
  EXPECT_EQ(std::memcmp(ref.data(), want.data(), n * sizeof(float)), 0);
  for (size_t where : {size_t{1}, n / 2 + 3, n - 2}) {
    const float keep = in[1][where];
    in[1][where] = where % 2 ? kNaN : -kInf;
    ASSERT_TRUE(p->SumScaledCheckFinite(y.data(), xs, 2, 0.5f, n, &first_bad).ok());
    EXPECT_EQ(first_bad, where);
    in[1][where] = keep;
  }
}

// Values whose magnitudes span many histogram bins (2^-20 .. 2^6, both signs), deterministic.
std::vector<float> Spread(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const float frac = 1.0f + static_cast<float>(s >> 9) / 8388608.0f;
    const int e = static_cast<int>((s >> 3) % 27) - 20;
    v[i] = std::ldexp(frac, e) * ((s & 1) ? -1.0f : 1.0f);
  }
  return v;
}

// The sum that counts the histogram of a range of what it writes (SumScaledCheckFiniteHistogram,
// MiCRO's partition counted in the local reduce): the same sums and first bad index as
// SumScaledCheckFinite, and the bins from first_bin on as a count of the sum after it would add
// (the bins start non-zero: they are added to), over small, odd and streamed sizes, ranges at
// the ends and inside, every bin (0), a middle bin and +Inf's bin, and a NaN inside the range.
TEST_P(NonfiniteReduceTest, HistogramOfTheSumIsACountAfterIt) {
  auto p = Make();
  auto ref = MakeReferencePrimitives();
  const size_t streamed = (size_t{2} << 20) / sizeof(float) + 4099;
  const uint32_t mid = Primitives::MagnitudeBits(0.01f) >> 15;
  for (size_t n : {size_t{1}, size_t{17}, size_t{1000}, size_t{70001}, streamed}) {
    std::vector<std::vector<float>> in = {Spread(n, 1), Spread(n, 2), Spread(n, 3)};
    const float* xs[3] = {in[0].data(), in[1].data(), in[2].data()};
    const std::vector<std::pair<size_t, size_t>> ranges = {
        {0, n}, {0, n / 2}, {n / 2, n}, {n / 3, n / 3}, {std::min<size_t>(3, n), n - n / 7}};
    for (bool nan : {false, true}) {
      const size_t where = n / 2 + (n > 2 ? 1 : 0);
      if (nan && where < n) in[1][where] = kNaN;
      for (const auto& [b, e] : ranges) {
        for (uint32_t first : {uint32_t{0}, mid, uint32_t{0xFF00}}) {
          std::vector<float> y(n, 7.0f), want(n, 7.0f);
          std::vector<uint32_t> bins(Primitives::kHistogramBins, 3), counted(bins);
          size_t bad = 1, want_bad = 2;
          HistogramRange h;
          h.begin = b;
          h.end = e;
          h.first_bin = first;
          h.bins = bins.data();
          ASSERT_TRUE(p->SumScaledCheckFiniteHistogram(y.data(), xs, 3, 0.5f, n, &bad, h).ok());
          ASSERT_TRUE(p->SumScaledCheckFinite(want.data(), xs, 3, 0.5f, n, &want_bad).ok());
          const std::string at = "n=" + std::to_string(n) + " range [" + std::to_string(b) + ", " +
                                 std::to_string(e) + ") first " + std::to_string(first) +
                                 (nan ? " with a NaN" : "");
          EXPECT_EQ(bad, want_bad) << at;
          EXPECT_EQ(std::memcmp(y.data(), want.data(), n * sizeof(float)), 0) << at;
          ref->AbsHistogram16(want.data(), b, e, counted.data());
          size_t wrong = 0;
          for (size_t k = first; k < Primitives::kHistogramBins; ++k)
            wrong += bins[k] != counted[k];
          EXPECT_EQ(wrong, 0u) << at;
        }
      }
    }
  }
}

TEST_P(NonfiniteReduceTest, HistogramRefusesARangePastTheSum) {
  auto p = Make();
  std::vector<float> x(8, 1.0f), y(8, 7.0f);
  const float* xs[1] = {x.data()};
  std::vector<uint32_t> bins(Primitives::kHistogramBins, 0);
  size_t bad = 0;
  HistogramRange h;
  h.begin = 2;
  h.end = 9;
  h.bins = bins.data();
  absl::Status s = p->SumScaledCheckFiniteHistogram(y.data(), xs, 1, 1.0f, 8, &bad, h);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[2, 9)"), std::string::npos) << s;
  EXPECT_EQ(y, std::vector<float>(8, 7.0f)) << "nothing written";
  h.end = 8;
  h.bins = nullptr;
  EXPECT_EQ(p->SumScaledCheckFiniteHistogram(y.data(), xs, 1, 1.0f, 8, &bad, h).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(NonfiniteReduceTest, RefusesNoInputs) {
  auto p = Make();
  float y = 0;
  size_t first_bad = 0;
  EXPECT_FALSE(p->SumScaledCheckFinite(&y, nullptr, 0, 1.0f, 1, &first_bad).ok());
}

INSTANTIATE_TEST_SUITE_P(Threads, NonfiniteReduceTest, testing::Values(0, 1, 2),
                         [](const testing::TestParamInfo<int>& i) {
                           return i.param == 0 ? std::string("reference")
                                               : "cpu" + std::to_string(i.param);
                         });

}  // namespace
}  // namespace spex
