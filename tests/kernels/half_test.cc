// The half-precision conversions of kernels/half.h against independent oracles: widening of
// every one of the 65536 bit patterns of each type against the value its fields encode
// (computed in double), narrowing against the nearest representable value found by search in
// a table of every finite half (ties to the even pattern), at every value, every midpoint and
// one float ulp either side, overflow, subnormals, zeros and NaN; and the bulk Highway passes
// against the scalar ones bit for bit, tails included.
#include "kernels/half.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace spex {
namespace {

struct Format {
  DType type;
  int mant_bits, bias;
};
const Format kBf16{DType::kBFloat16, 7, 127};
const Format kF16{DType::kFloat16, 10, 15};

// The value of half pattern h of format f, from its fields (NaN: quiet NaN).
double FieldValue(const Format& f, uint16_t h) {
  const int exp_bits = 15 - f.mant_bits;
  const int emax = (1 << exp_bits) - 1;
  const int e = (h >> f.mant_bits) & emax;
  const int m = h & ((1 << f.mant_bits) - 1);
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == emax) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, 1 - f.bias - f.mant_bits);
  return sign * std::ldexp((1 << f.mant_bits) + m, e - f.bias - f.mant_bits);
}

// Every non-negative finite value of the format, ascending, and the pattern of each.
std::vector<double> PositiveValues(const Format& f) {
  std::vector<double> v;
  for (uint32_t h = 0; h < 0x8000; ++h) {
    const double x = FieldValue(f, static_cast<uint16_t>(h));
    if (std::isfinite(x)) v.push_back(x);
  }
  return v;
}

// The oracle: x rounded to the nearest value of the format, ties to the even pattern, and
// to Inf where the nearest is max + one ulp (the first value past the largest finite one).
uint16_t OracleNarrow(const Format& f, const std::vector<double>& pos, float x) {
  if (std::isnan(x)) return 0x7fff;  // any NaN; the test checks NaN-ness, not the pattern
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  const double max = pos.back();
  const double past = max + (max - pos[pos.size() - 2]);
  const uint16_t inf = static_cast<uint16_t>(sign | (0x7fff & ~((1 << f.mant_bits) - 1)));
  if (a >= past) return inf;
  if (a > max) {  // between max and past: ties go to past (max's pattern is odd)
    return (a - max) < (past - a) ? static_cast<uint16_t>(sign | (pos.size() - 1)) : inf;
  }
  const size_t hi = std::lower_bound(pos.begin(), pos.end(), a) - pos.begin();
  if (pos[hi] == a) return static_cast<uint16_t>(sign | hi);
  const size_t lo = hi - 1;
  const double dl = a - pos[lo], dh = pos[hi] - a;
  const size_t pick = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint16_t>(sign | pick);
}

bool IsHalfNan(const Format& f, uint16_t h) {
  const uint16_t exp_mask = 0x7fff & ~((1 << f.mant_bits) - 1);
  return (h & exp_mask) == exp_mask && (h & ((1 << f.mant_bits) - 1)) != 0;
}

class HalfTest : public ::testing::TestWithParam<Format> {};

TEST_P(HalfTest, WidenEveryPatternExactly) {
  const Format f = GetParam();
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> bulk(all.size());
  half::Widen(f.type, all.data(), bulk.data(), all.size());
  for (uint32_t h = 0; h < 65536; ++h) {
    const double want = FieldValue(f, static_cast<uint16_t>(h));
    const float got = HalfToFloat(f.type, static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      // The payload survives: narrowing the NaN gives the same pattern back.
      ASSERT_EQ(FloatToHalf(f.type, got) & 0x7fff, (h | (1 << (f.mant_bits - 1))) & 0x7fff)
          << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;  // -0 stays -0
    }
    ASSERT_EQ(FloatBits(bulk[h]), FloatBits(got)) << "bulk widen differs at " << std::hex << h;
  }
}

TEST_P(HalfTest, NarrowAtValuesMidpointsAndNeighbours) {
  const Format f = GetParam();
  const std::vector<double> pos = PositiveValues(f);
  std::vector<float> xs;
  for (size_t i = 0; i < pos.size(); ++i) {
    const float v = static_cast<float>(pos[i]);
    xs.push_back(v);
    xs.push_back(-v);
    if (i + 1 < pos.size()) {
      const float mid = static_cast<float>((pos[i] + pos[i + 1]) / 2);  // exact in float32
      ASSERT_EQ(static_cast<double>(mid), (pos[i] + pos[i + 1]) / 2);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        xs.push_back(x);
        xs.push_back(-x);
      }
    }
  }
  // Overflow, the float extremes, subnormal floats, NaN.
  for (float x :
       {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e30f, 3.4028235e38f, INFINITY, 0x1.fep127f,
        1e-45f, 1e-40f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f, 0.0f,
        std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::signaling_NaN()}) {
    xs.push_back(x);
    xs.push_back(-x);
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) xs.push_back(BitsFloat(bits(rng)));
  std::vector<uint16_t> bulk(xs.size());
  half::Narrow(f.type, xs.data(), bulk.data(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    const uint16_t got = FloatToHalf(f.type, x);
    if (std::isnan(x)) {
      ASSERT_TRUE(IsHalfNan(f, got)) << x;
    } else {
      ASSERT_EQ(got, OracleNarrow(f, pos, x)) << "x=" << x << " bits " << std::hex << FloatBits(x);
    }
    ASSERT_EQ(bulk[i], got) << "bulk narrow differs at x=" << x << " (" << i << ")";
  }
}

TEST_P(HalfTest, SumWidenScaledMatchesScalarAndFindsNonfinite) {
  const Format f = GetParam();
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 3.0f);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{33}, size_t{1000}, size_t{4099}}) {
    for (int count : {1, 3}) {
      for (bool with_acc : {false, true}) {
        std::vector<std::vector<uint16_t>> in(count, std::vector<uint16_t>(n));
        std::vector<const uint16_t*> ptr;
        for (auto& v : in) {
          for (auto& h : v) h = FloatToHalf(f.type, g(rng));
          ptr.push_back(v.data());
        }
        std::vector<float> acc(n);
        for (auto& a : acc) a = g(rng);
        for (float scale : {1.0f, 0.25f, 1.0f / 3}) {
          std::vector<float> y(n, -1.0f), want(n);
          const size_t bad = half::SumWidenScaled(f.type, y.data(), with_acc ? acc.data() : nullptr,
                                                  ptr.data(), count, scale, n, true);
          EXPECT_EQ(bad, n);
          for (size_t i = 0; i < n; ++i) {
            float s = with_acc ? acc[i] : HalfToFloat(f.type, in[0][i]);
            for (int r = with_acc ? 0 : 1; r < count; ++r) s += HalfToFloat(f.type, in[r][i]);
            want[i] = scale == 1.0f ? s : s * scale;
            ASSERT_EQ(FloatBits(y[i]), FloatBits(want[i])) << n << " " << i;
          }
          if (n > 20) {  // a NaN input and an Inf input: the lowest index is reported
            in[count - 1][n - 3] = FloatToHalf(f.type, INFINITY);
            in[0][n - 9] = FloatToHalf(f.type, NAN);
            EXPECT_EQ(
                half::SumWidenScaled(f.type, y.data(), nullptr, ptr.data(), count, scale, n, true),
                n - 9);
            EXPECT_EQ(
                half::SumWidenScaled(f.type, y.data(), nullptr, ptr.data(), count, scale, n, false),
                n);
            in[0][n - 9] = 0;
            in[count - 1][n - 3] = 0;
          }
        }
      }
    }
  }
}

// SumWidenNarrow is Narrow(SumWidenScaled) bit for bit, tails included, written in place over
// one of its inputs too, and reports the first non-finite sum as SumWidenScaled does.
TEST_P(HalfTest, SumWidenNarrowIsNarrowOfSumWidenScaled) {
  const Format f = GetParam();
  std::mt19937 rng(17);
  std::normal_distribution<float> g(0.0f, 3.0f);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{33}, size_t{1000}, size_t{4099}}) {
    for (int count : {1, 2, 4}) {
      for (bool with_acc : {false, true}) {
        for (float scale : {1.0f, 0.25f, 1.0f / 3}) {
          std::vector<std::vector<uint16_t>> in(count, std::vector<uint16_t>(n));
          std::vector<const uint16_t*> ptr;
          for (auto& v : in) {
            for (auto& h : v) h = FloatToHalf(f.type, g(rng));
            ptr.push_back(v.data());
          }
          std::vector<float> acc(n), sum(n);
          for (auto& a : acc) a = g(rng) * 1e3f;  // float16 sums that overflow too
          const float* accp = with_acc ? acc.data() : nullptr;
          if (n > 20) in[count - 1][n - 5] = FloatToHalf(f.type, NAN);
          const size_t want_bad =
              half::SumWidenScaled(f.type, sum.data(), accp, ptr.data(), count, scale, n, true);
          std::vector<uint16_t> want(n), got(n, 0xabcd);
          half::Narrow(f.type, sum.data(), want.data(), n);
          EXPECT_EQ(
              half::SumWidenNarrow(f.type, got.data(), accp, ptr.data(), count, scale, n, true),
              want_bad);
          EXPECT_EQ(got, want) << "n " << n << " count " << count;
          // In place over the last input.
          EXPECT_EQ(half::SumWidenNarrow(f.type, in[count - 1].data(), accp, ptr.data(), count,
                                         scale, n, false),
                    n);
          EXPECT_EQ(in[count - 1], want) << "in place, n " << n << " count " << count;
        }
      }
    }
  }
}

// KeepRounding against the scalar formula, bit for bit: pattern B (from the selected values) and
// A (in place), at sorted and shuffled distinct positions, values of every kind (normal, ties,
// subnormal, overflowing, Inf, NaN), counts around the vector width; other positions untouched.
TEST_P(HalfTest, KeepRoundingMatchesScalar) {
  const Format f = GetParam();
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 3.0f);
  const float specials[] = {1e-6f,     -3e-8f, 1e-40f,         7e4f,  3e38f,   INFINITY,
                            -INFINITY, NAN,    1.00048828125f, -0.0f, 65520.0f};
  const size_t n = 5000;
  for (size_t count : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{1234}}) {
    for (bool from_val : {false, true}) {
      for (bool shuffled : {false, true}) {
        std::vector<float> acc(n);
        for (size_t i = 0; i < n; ++i) acc[i] = i % 13 == 0 ? specials[i / 13 % 11] : g(rng);
        std::vector<uint32_t> idx(n);
        for (uint32_t i = 0; i < n; ++i) idx[i] = i;
        std::shuffle(idx.begin(), idx.end(), rng);
        idx.resize(count);
        if (!shuffled) std::sort(idx.begin(), idx.end());
        std::vector<float> val(count);
        for (size_t j = 0; j < count; ++j) val[j] = j % 7 == 0 ? specials[j / 7 % 11] : g(rng);
        std::vector<float> want = acc;
        for (size_t j = 0; j < count; ++j) {
          const float v = from_val ? val[j] : want[idx[j]];
          want[idx[j]] = v - HalfToFloat(f.type, FloatToHalf(f.type, v));
        }
        half::KeepRounding(f.type, acc.data(), idx.data(), from_val ? val.data() : nullptr, count);
        size_t wrong = 0;
        for (size_t i = 0; i < n; ++i) {
          // NaN - x is a NaN either way; its bits are the operand's, compared like the rest.
          wrong += FloatBits(acc[i]) != FloatBits(want[i]);
        }
        EXPECT_EQ(wrong, 0u) << "count " << count << " from_val " << from_val << " shuffled "
                             << shuffled;
      }
    }
  }
}

// GatherKeepRounding is Gather then KeepRounding (val null) in one pass, bit for bit: the gathered
// values are acc's before the pass, acc keeps what rounding took off, other positions untouched.
// Fails if the pass gathers after writing, skips the tail past the vector width, or rounds
// differently from KeepRounding.
TEST_P(HalfTest, GatherKeepRoundingIsGatherThenKeepRounding) {
  const Format f = GetParam();
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 3.0f);
  const float specials[] = {1e-6f, -3e-8f, 1e-40f, 7e4f, INFINITY, NAN, 1.00048828125f, -0.0f};
  const size_t n = 4099;
  for (size_t count : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{2049}}) {
    std::vector<float> acc(n);
    for (size_t i = 0; i < n; ++i) acc[i] = i % 11 == 0 ? specials[i / 11 % 8] : g(rng);
    std::vector<uint32_t> idx(n);
    for (uint32_t i = 0; i < n; ++i) idx[i] = i;
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(count);
    std::sort(idx.begin(), idx.end());
    std::vector<float> want = acc, want_val(count);
    for (size_t j = 0; j < count; ++j) want_val[j] = want[idx[j]];
    half::KeepRounding(f.type, want.data(), idx.data(), nullptr, count);
    std::vector<float> got_val(count, 42.0f);
    half::GatherKeepRounding(f.type, acc.data(), idx.data(), count, got_val.data());
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += FloatBits(acc[i]) != FloatBits(want[i]);
    for (size_t j = 0; j < count; ++j) wrong += FloatBits(got_val[j]) != FloatBits(want_val[j]);
    EXPECT_EQ(wrong, 0u) << "count " << count;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, HalfTest, ::testing::Values(kBf16, kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param.type)); });

TEST(DTypeTest, NamesAndSizes) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(*ParseDType("bf16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("float16"), DType::kFloat16);
  EXPECT_EQ(*ParseDType("float32"), DType::kFloat32);
  absl::StatusOr<DType> bad = ParseDType("int8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bfloat16"), std::string::npos);
  EXPECT_NE(bad.status().message().find("int8"), std::string::npos);
}

}  // namespace
}  // namespace spex
