// RedSync and RedSync-trim: the search bounds and probe sequences on crafted counts (at most 3
// probes for the published redsync search with eps = 0.2, thresholds inside [mean, max]; 0.8 down
// to 0.0 for trim), the band search continuing from the published probes until k < count < 2k,
// and the compressors selecting exactly |acc| > threshold (redsync_trim with trim: the exact
// top-k of those candidates).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>

#include "kernels/compressors/magnitude_histogram.h"
#include "kernels/compressors/selection.h"
#include "kernels/compressors/threshold_search.h"
#include "kernels/cpu/cpu_primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

// Records the r of every probe for mean 1, max 2 (th = 1 + r).
struct Probe {
  std::vector<double> r;
  std::function<size_t(double)> count;
  size_t operator()(float t) {
    r.push_back(t - 1.0);
    return count(t - 1.0);
  }
};

TEST(RedSyncSearch, ProbeSequencesAndBounds) {
  int probes;
  Probe none{{}, [](double) { return size_t{0}; }};
  float th = RedSyncSearch(1.0, 2.0, 100, std::ref(none), &probes);
  EXPECT_EQ(probes, 3);
  EXPECT_EQ(none.r, (std::vector<double>{0.5, 0.25, 0.125})) << "too few: upper bound comes down";
  EXPECT_FLOAT_EQ(th, 1.125f);
  Probe all{{}, [](double) { return size_t{1000000}; }};
  th = RedSyncSearch(1.0, 2.0, 100, std::ref(all), &probes);
  EXPECT_EQ(all.r, (std::vector<double>{0.5, 0.75, 0.875})) << "too many: lower bound goes up";
  EXPECT_FLOAT_EQ(th, 1.875f);
  Probe hit{{}, [](double) { return size_t{150}; }};  // k < 150 < 2k at once
  th = RedSyncSearch(1.0, 2.0, 100, std::ref(hit), &probes);
  EXPECT_EQ(probes, 1);
  EXPECT_FLOAT_EQ(th, 1.5f);
  // Between k/2 and k the documented rule still raises the lower bound.
  Probe mid{{}, [](double) { return size_t{70}; }};
  RedSyncSearch(1.0, 2.0, 100, std::ref(mid), &probes);
  EXPECT_EQ(mid.r, (std::vector<double>{0.5, 0.75, 0.875}));
  for (const Probe* p : {&none, &all, &hit, &mid}) {
    for (double r : p->r) {
      EXPECT_GE(r, 0.0);
      EXPECT_LE(r, 1.0);
    }
  }
}

TEST(RedSyncTrimSearch, DescendsUntilKAreSelected) {
  int probes;
  Probe p{{}, [](double r) { return r < 0.5 ? size_t{500} : size_t{10}; }};
  EXPECT_FLOAT_EQ(RedSyncTrimSearch(1.0, 2.0, 100, std::ref(p), &probes), 1.4f);
  EXPECT_EQ(probes, 3);
  ASSERT_EQ(p.r.size(), 3u);
  EXPECT_NEAR(p.r[0], 0.8, 1e-6);
  EXPECT_NEAR(p.r[1], 0.6, 1e-6);
  EXPECT_NEAR(p.r[2], 0.4, 1e-6);
  Probe never{{}, [](double) { return size_t{0}; }};
  EXPECT_FLOAT_EQ(RedSyncTrimSearch(1.0, 2.0, 100, std::ref(never), &probes), 1.0f);
  EXPECT_EQ(probes, 5) << "r = 0.8, 0.6, 0.4, 0.2, 0.0";
}

TEST(RedSyncBandSearch, ContinuesThePublishedSearchIntoTheBand) {
  // count(th) = 1e6 (2 - th)^4 for mean 1, max 2: the published probes r = 0.5, 0.75, 0.875 all
  // select at least 2k (k = 100), so it stops at r = 0.875 with 244 (outside k < count < 2k).
  auto fourth = [](float t) {
    const double u = 2.0 - t;
    return static_cast<size_t>(1e6 * u * u * u * u);
  };
  int probes;
  EXPECT_FLOAT_EQ(RedSyncSearch(1.0, 2.0, 100, fourth, &probes), 1.875f);
  EXPECT_EQ(probes, 3);
  Probe band{{}, [&](double r) { return fourth(static_cast<float>(1.0 + r)); }};
  const float th = RedSyncBandSearch(1.0, 2.0, 100, std::ref(band), &probes);
  ASSERT_EQ(band.r.size(), 6u);
  EXPECT_EQ(probes, 6);
  // Bisection of th between the last probe with too many (1.875) and max (2, none above).
  EXPECT_NEAR(band.r[3], 0.9375, 1e-6);
  EXPECT_NEAR(band.r[4], 0.90625, 1e-6);
  EXPECT_NEAR(band.r[5], 0.890625, 1e-6);
  EXPECT_FLOAT_EQ(th, 1.890625f);
  EXPECT_GT(fourth(th), 100u);
  EXPECT_LT(fourth(th), 200u);
  // When the published search lands inside the band, the band search returns its threshold.
  Probe hit{{}, [](double) { return size_t{150}; }};
  EXPECT_FLOAT_EQ(RedSyncBandSearch(1.0, 2.0, 100, std::ref(hit), &probes), 1.5f);
  EXPECT_EQ(probes, 1);
  // Counts 1000 (1 - r)^4: the published probes raise the threshold at r = 0.5 (62, between k/2
  // and k: the published rule) and end at r = 0.625 (19); the band search then comes back down
  // (r = 0.25: 316, too many; r = 0.375: 152, inside).
  Probe low{{}, [&](double r) { return fourth(static_cast<float>(1.0 + r)) / 1000; }};
  const float low_th = RedSyncBandSearch(1.0, 2.0, 100, std::ref(low), &probes);
  EXPECT_EQ(low.r, (std::vector<double>{0.5, 0.75, 0.625, 0.25, 0.375}));
  EXPECT_FLOAT_EQ(low_th, 1.375f);
}

TEST(RedSyncBandSearch, UnreachableBandEndsAtTheNearestProbe) {
  // A step: 1000 entries below th = 1.5, none above: no threshold selects k < count < 2k. The
  // bisection stops when no float lies between its brackets (or after 40 probes) and keeps the
  // nearest probe (1000 is nearer to the band than 0).
  auto step = [](float t) { return t < 1.5f ? size_t{1000} : size_t{0}; };
  int probes;
  const float th = RedSyncBandSearch(1.0, 2.0, 100, step, &probes);
  EXPECT_EQ(step(th), 1000u);
  EXPECT_LE(probes, kBandMaxProbes);
  // k = 1: the band 1 < count < 2 is empty; the search still ends (and selects something).
  auto smooth = [](float t) { return static_cast<size_t>(100 * (2.0 - t)); };
  EXPECT_GT(smooth(RedSyncBandSearch(1.0, 2.0, 1, smooth, &probes)), 0u);
  EXPECT_LE(probes, kBandMaxProbes);
}

TEST(CutCount, ExactOnlyWhereTheBoundsStraddleACut) {
  // Bounds [t, t + 10] for threshold t; cuts at 50 and 100.
  int exact_calls = 0;
  const CountFn count = CutCount(
      [](float t, size_t* lo, size_t* hi) {
        *lo = static_cast<size_t>(t);
        *hi = *lo + 10;
      },
      {50.0, 100.0},
      [&](float t) {
        ++exact_calls;
        return static_cast<size_t>(t) + 5;
      });
  EXPECT_EQ(count(20.0f), 20u);  // [20, 30]: below both cuts
  EXPECT_EQ(count(60.0f), 60u);  // [60, 70]: between them
  EXPECT_EQ(count(200.0f), 200u);
  EXPECT_EQ(exact_calls, 0);
  EXPECT_EQ(count(45.0f), 50u);  // [45, 55] holds 50: counted exactly
  EXPECT_EQ(count(90.0f), 95u);  // [90, 100] holds 100
  EXPECT_EQ(exact_calls, 2);
  EXPECT_EQ(count(100.0f), 100u);  // [100, 110]: at the cut is on its upper side
  EXPECT_EQ(exact_calls, 2);
}

TEST(MagnitudeHistogram, BoundsHoldTheExactCount) {
  auto prims = MakeCpuPrimitives(1);
  std::vector<float> x = Laplace(50000, 8);
  x[10] = std::numeric_limits<float>::infinity();
  x[11] = -std::numeric_limits<float>::infinity();
  x[12] = std::numeric_limits<float>::quiet_NaN();
  x[13] = 0.0f;
  MagnitudeHistogram h;
  h.Build(prims.get(), x.data(), x.size());
  size_t tight = 0;
  for (float t : {1e-9f, 1e-5f, 3e-4f, 1e-3f, 2.5e-3f, 7e-3f, 0.02f, 1e30f}) {
    size_t exact = 0;
    for (float v : x) exact += std::fabs(v) >= t;
    size_t lo, hi;
    h.Bounds(t, &lo, &hi);
    EXPECT_LE(lo, exact) << t;
    EXPECT_GE(hi, exact) << t;
    // Within one bin (2^-7 of t wide) plus the Inf bin.
    EXPECT_LE(hi - lo, 2 + x.size() / 50) << t;
    tight += hi - lo <= 3;
  }
  EXPECT_GE(tight, 2u) << "the tails' bins are nearly empty";
  size_t lo, hi;
  h.Bounds(0.0f, &lo, &hi);
  EXPECT_EQ(lo, 0u);
  EXPECT_EQ(hi, x.size()) << "no bound for a non-positive threshold";
}

// The default searches count on the histogram; they must decide exactly as with exact counts.
TEST(RedSync, HistogramCountedSearchesEqualExactlyCountedOnes) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 200000;
  std::mt19937 gen(4);
  std::student_t_distribution<float> t(2.5f);
  std::vector<float> heavy(n);
  for (float& v : heavy) v = 1e-3f * t(gen);
  std::vector<float> laplace = Laplace(n, 6);
  for (const std::vector<float>* x : {&heavy, &laplace}) {
    for (double d : {0.01, 0.001}) {
      const size_t k = static_cast<size_t>(d * n);
      const AbsMoments m = prims->Moments(x->data(), n, -1.0f);
      auto exact = [&](float th) { return Above(*x, std::max(th, kMinThreshold), true).size(); };
      int probes;
      const float want =
          std::max(RedSyncBandSearch(m.sum / n, m.max, k, exact, &probes), kMinThreshold);
      auto c = MustMake("redsync", d, n, prims.get());
      std::vector<float> acc = *x;
      Selection sel;
      ASSERT_TRUE(c->Select(0, acc.data(), nullptr, false, &sel).ok());
      EXPECT_EQ(sel.scalars[0], want) << "d=" << d;
      EXPECT_EQ(sel.scalars[1], static_cast<float>(probes)) << "d=" << d;
      EXPECT_GT(sel.idx.size(), k);
      EXPECT_LT(sel.idx.size(), 2 * k);
      EXPECT_LE(sel.scalars[2], 4.0f) << "moments, histogram, select (+ an exact count)";
      const float trim_want =
          std::max(RedSyncTrimSearch(m.sum / n, m.max, k, exact, &probes), kMinThreshold);
      auto trim = MustMake("redsync_trim", d, n, prims.get());
      acc = *x;
      ASSERT_TRUE(trim->Select(0, acc.data(), nullptr, false, &sel).ok());
      EXPECT_EQ(sel.scalars[0], trim_want) << "d=" << d;
      EXPECT_EQ(sel.idx.size(), k);
    }
  }
}

// redsync_trim's top-k is taken from the histogram's top bins: on coarsely rounded magnitudes
// (many ties at the k-th one) it is still the exact top-k of all of acc, ties toward the lower
// index, and it zeroes exactly what it sends.
TEST(RedSync, TrimIsTheExactTopKWithTies) {
  for (int threads : {1, 2}) {
    auto prims = MakeCpuPrimitives(threads);
    const size_t n = 300007;
    std::vector<float> x = Laplace(n, 11);
    for (float& v : x) v = std::round(v * 4000.0f) / 4.0f;
    for (double d : {0.01, 0.001}) {
      SCOPED_TRACE(testing::Message() << "threads=" << threads << " d=" << d);
      const size_t k = static_cast<size_t>(d * n);
      std::vector<uint32_t> want_idx(k);
      std::vector<float> want_val(k);
      ASSERT_EQ(prims->TopK(x.data(), n, k, want_idx.data(), want_val.data()), k);
      auto c = MustMake("redsync_trim", d, n, prims.get());
      std::vector<float> acc = x;
      Selection sel;
      ASSERT_TRUE(c->Select(0, acc.data(), nullptr, true, &sel).ok());
      EXPECT_EQ(sel.idx, want_idx);
      EXPECT_EQ(sel.val, want_val);
      size_t zeroed = 0;
      for (size_t i = 0; i < n; ++i) zeroed += acc[i] == 0.0f && x[i] != 0.0f;
      EXPECT_EQ(zeroed, k);
    }
  }
}

TEST(RedSync, CompressorsSelectStrictlyAboveTheirThreshold) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 100000;
  const std::vector<float> x = Laplace(n, 3);
  double mean = 0, max = 0;
  for (float v : x) {
    mean += std::fabs(v) / n;
    max = std::max<double>(max, std::fabs(v));
  }
  const std::map<std::string, std::string> reference_redsync{{"search", "reference"}};
  const std::map<std::string, std::string> reference_trim{{"trim", "false"}};
  for (const char* name : {"redsync", "redsync_trim"}) {
    for (bool reference : {true, false}) {
      SCOPED_TRACE(testing::Message() << name << (reference ? " reference" : " band/trim"));
      const bool trim = std::string(name) == "redsync_trim";
      auto c = MustMake(name, 0.01, n, prims.get(),
                        reference ? (trim ? reference_trim : reference_redsync)
                                  : std::map<std::string, std::string>{});
      std::vector<float> acc = x;
      Selection sel;
      ASSERT_TRUE(c->Select(0, acc.data(), nullptr, true, &sel).ok());
      const std::vector<uint32_t> above = Above(x, sel.scalars[0], true);
      EXPECT_GE(sel.scalars[0], mean * (1 - 1e-6));
      EXPECT_LE(sel.scalars[0], max);
      if (trim && !reference) {
        // The exact top-k of the candidates |x| > th, of which there are at least k.
        const size_t k = 1000;
        ASSERT_GE(above.size(), k);
        ASSERT_EQ(sel.idx.size(), k);
        std::vector<float> mag(x.size());
        for (size_t i = 0; i < n; ++i) mag[i] = std::fabs(x[i]);
        std::nth_element(mag.begin(), mag.begin() + (k - 1), mag.end(), std::greater<float>());
        EXPECT_EQ(sel.idx, Above(x, mag[k - 1], false)) << "not the top-k (no ties here)";
      } else {
        EXPECT_EQ(sel.idx, above);
      }
      for (uint32_t i : sel.idx) EXPECT_EQ(acc[i], 0.0f);
      if (reference) {
        EXPECT_LE(sel.scalars[1], trim ? 5.0f : 3.0f);
        if (trim) {
          EXPECT_GE(sel.idx.size(), 1000u);
        }
      } else if (!trim) {
        EXPECT_GT(sel.idx.size(), 1000u);
        EXPECT_LT(sel.idx.size(), 2000u);
      }
    }
  }
}

}  // namespace
}  // namespace spex
