// RedSync and RedSync-trim: the search bounds and probe sequences on crafted counts (at most 3
// probes for redsync with eps = 0.2, thresholds inside [mean, max]; 0.8 down to 0.0 for trim), and
// the compressors selecting exactly |acc| > threshold.
#include "kernels/compressors/threshold_search.h"

#include <cmath>

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

TEST(RedSync, CompressorsSelectStrictlyAboveTheirThreshold) {
  auto prims = MakeCpuPrimitives(1);
  const size_t n = 100000;
  const std::vector<float> x = Laplace(n, 3);
  double mean = 0, max = 0;
  for (float v : x) {
    mean += std::fabs(v) / n;
    max = std::max<double>(max, std::fabs(v));
  }
  for (const char* name : {"redsync", "redsync_trim"}) {
    auto c = MustMake(name, 0.01, n, prims.get());
    std::vector<float> acc = x;
    Selection sel;
    ASSERT_TRUE(c->Select(0, acc.data(), nullptr, true, &sel).ok());
    EXPECT_EQ(sel.idx, Above(x, sel.scalars[0], true)) << name;
    EXPECT_GE(sel.scalars[0], mean * (1 - 1e-6)) << name;
    EXPECT_LE(sel.scalars[0], max) << name;
    EXPECT_LE(sel.scalars[1], std::string(name) == "redsync" ? 3.0f : 5.0f) << name;
    if (std::string(name) == "redsync_trim") {
      EXPECT_GE(sel.idx.size(), 1000u);
    }
  }
}

}  // namespace
}  // namespace spex
