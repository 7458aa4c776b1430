// The device-side histogram threshold without a GPU: the two-level walk the CUDA kernel runs
// (kernels/cuda/histogram_edge.h EdgeFromBins over EdgeChunkSum's chunk sums) equals
// Primitives::WalkHistogramEdge, the walk the host path and the default implementation use, on
// sparse, dense, single-bin and NaN-heavy histograms, with every first bin and quota at the
// chunk edges; and Primitives::AbsHistogramEdge (the default, on the CPU primitives) agrees with
// counting the bins itself, and refuses a zero quota and a first bin above +Inf's; the default on
// a device that has no walk of its own (the bins copied back); on a GPU (only there) the CUDA
// implementation against the CPU's.
#include "kernels/cuda/histogram_edge.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/primitives.h"
#include "tests/support/forwarding_primitives.h"

namespace spex {
namespace {

using gpu::EdgePick;
using gpu::kEdgeChunkBins;
using gpu::kEdgeChunks;
using gpu::kEdgeInfBin;

EdgePick TwoLevel(const std::vector<uint32_t>& bins, uint32_t first, uint64_t quota) {
  const uint32_t lo = gpu::EdgeLowBin(first);
  std::vector<uint64_t> partial(kEdgeChunks);
  for (uint32_t c = 0; c < kEdgeChunks; ++c) partial[c] = gpu::EdgeChunkSum(bins.data(), c, lo);
  return gpu::EdgeFromBins(bins.data(), partial.data(), lo, quota);
}

void ExpectSame(const std::vector<uint32_t>& bins, uint32_t first, uint64_t quota) {
  const HistogramEdge want = Primitives::WalkHistogramEdge(bins.data(), first, quota);
  const EdgePick got = TwoLevel(bins, first, quota);
  SCOPED_TRACE(::testing::Message() << "first " << first << " quota " << quota);
  EXPECT_EQ(got.bin, want.bin);
  EXPECT_EQ(got.reached, want.reached);
  EXPECT_EQ(got.cum, want.cum);
  EXPECT_EQ(got.in_edge, want.in_edge);
}

// Quotas around every interesting count: each chunk edge's running total and its neighbours.
std::vector<uint64_t> Quotas(const std::vector<uint32_t>& bins) {
  std::vector<uint64_t> q = {1, 2, 3};
  uint64_t run = 0;
  for (uint32_t b = kEdgeInfBin + 1; b-- > 1;) {
    run += bins[b];
    if (b % kEdgeChunkBins == 0 || b == kEdgeInfBin) {
      for (uint64_t d : {run - (run > 0), run, run + 1}) q.push_back(std::max<uint64_t>(d, 1));
    }
  }
  return q;
}

TEST(HistogramEdge, TwoLevelWalkEqualsTheHostWalk) {
  std::mt19937 gen(7);
  std::vector<std::vector<uint32_t>> cases;
  std::vector<uint32_t> b(Primitives::kHistogramBins, 0);
  cases.push_back(b);  // empty
  b[0] = 1000;         // zeros only: never counted
  cases.push_back(b);
  b.assign(b.size(), 0);
  b[0x3c00] = 50;  // one bin
  cases.push_back(b);
  b.assign(b.size(), 0);
  for (uint32_t i = 0; i < b.size(); ++i) b[i] = gen() % 3;  // dense, NaN bins included
  cases.push_back(b);
  b.assign(b.size(), 0);
  for (int i = 0; i < 300; ++i) b[gen() % 65536] += 1 + gen() % 100;  // sparse
  b[kEdgeInfBin] = 9;                                                 // +-Inf
  b[kEdgeInfBin + 1] = 1u << 30;                                      // NaNs: never counted
  cases.push_back(b);
  b.assign(b.size(), 0);
  // Gradient-like: a bell of exponents around 2^-8.
  std::normal_distribution<double> bell(0x3b80, 600);
  for (int i = 0; i < 200000; ++i) {
    const double v = bell(gen);
    if (v >= 1 && v < kEdgeInfBin) b[static_cast<uint32_t>(v)]++;
  }
  cases.push_back(b);
  for (const auto& bins : cases) {
    for (uint32_t first :
         {0u, 1u, 2u, 63u, 64u, 65u, 0x3b00u, 0x3bffu, kEdgeInfBin - 1, kEdgeInfBin}) {
      for (uint64_t quota : Quotas(bins)) ExpectSame(bins, first, quota);
    }
  }
}

TEST(HistogramEdge, DefaultAbsHistogramEdgeMatchesItsBins) {
  std::unique_ptr<Primitives> p = MakeCpuPrimitives(1);
  std::mt19937 gen(3);
  std::exponential_distribution<float> expo(100.0f);
  std::vector<float> x(100003);
  for (float& v : x) v = (gen() % 2 ? 1 : -1) * expo(gen);
  x[5] = std::numeric_limits<float>::infinity();
  x[6] = std::numeric_limits<float>::quiet_NaN();
  x[7] = 0;
  for (uint32_t first : {0u, 0x3a00u}) {
    std::vector<uint32_t> bins(Primitives::kHistogramBins, 0);
    p->AbsHistogram16From(x.data(), 10, x.size() - 10, first, bins.data());
    for (uint64_t quota : {uint64_t{1}, uint64_t{1000}, uint64_t{99990}, uint64_t{200000}}) {
      absl::StatusOr<HistogramEdge> e =
          p->AbsHistogramEdge(x.data(), 10, x.size() - 10, first, quota);
      ASSERT_TRUE(e.ok()) << e.status();
      const HistogramEdge want = Primitives::WalkHistogramEdge(bins.data(), first, quota);
      EXPECT_EQ(e->bin, want.bin);
      EXPECT_EQ(e->reached, want.reached);
      EXPECT_EQ(e->cum, want.cum);
      EXPECT_EQ(e->in_edge, want.in_edge);
      // The edge's meaning, from the data: cum entries at or above the bin's lower edge.
      if (e->reached) {
        const uint32_t bits = e->bin << 15;
        float edge;
        std::memcpy(&edge, &bits, 4);
        EXPECT_EQ(p->CountAbove(x.data() + 10, x.size() - 20, edge), e->cum);
        EXPECT_GE(e->cum, quota);
      }
    }
  }
  EXPECT_EQ(p->AbsHistogramEdge(x.data(), 0, x.size(), 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status high = p->AbsHistogramEdge(x.data(), 0, x.size(), 0xFF01, 1).status();
  EXPECT_EQ(high.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(high.message().find("0xFF00"), std::string::npos) << high;
}

// A device without an AbsHistogramEdge of its own (the default's device branch): the CPU
// primitives claiming Device::kCuda, counting what they copy to the host. The default counts the
// bins in AllocScratch memory and copies back the bins from first_bin on.
class DeviceWithoutEdge final : public test::ForwardingPrimitives {
 public:
  DeviceWithoutEdge() : ForwardingPrimitives(MakeCpuPrimitives(1)) {}
  uint64_t to_host = 0;
  Device device() const override { return Device::kCuda; }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    to_host += bytes;
    return inner()->CopyToHost(dst, src, bytes);
  }
};

TEST(HistogramEdge, TheDefaultOnADeviceCopiesTheBinsBackAndAgrees) {
  std::unique_ptr<Primitives> cpu = MakeCpuPrimitives(1);
  DeviceWithoutEdge dev;
  std::mt19937 gen(5);
  std::exponential_distribution<float> expo(100.0f);
  std::vector<float> x(70001);
  for (float& v : x) v = (gen() % 2 ? 1 : -1) * expo(gen);
  for (uint32_t first : {0u, 0x3a00u}) {
    for (uint64_t quota : {uint64_t{1}, uint64_t{700}, uint64_t{100000}}) {
      auto want = cpu->AbsHistogramEdge(x.data(), 3, x.size(), first, quota);
      const uint64_t before = dev.to_host;
      auto got = dev.AbsHistogramEdge(x.data(), 3, x.size(), first, quota);
      ASSERT_TRUE(want.ok() && got.ok()) << got.status();
      EXPECT_EQ(got->bin, want->bin);
      EXPECT_EQ(got->reached, want->reached);
      EXPECT_EQ(got->cum, want->cum);
      EXPECT_EQ(got->in_edge, want->in_edge);
      EXPECT_EQ(dev.to_host - before, (Primitives::kHistogramBins - first) * 4);
    }
  }
}

// On a GPU (skips without one): the CUDA AbsHistogramEdge equals the CPU primitives' on gradient-
// like data with zeros, +-Inf and NaNs, for every first bin and quota tried, and its host staging
// takes a copy.
TEST(HistogramEdge, CudaEqualsTheCpu) {
  std::unique_ptr<Primitives> gpu;
  if (absl::Status s = MakeCudaPrimitives(&gpu); !s.ok()) GTEST_SKIP() << s;
  std::unique_ptr<Primitives> cpu = MakeCpuPrimitives(1);
  std::mt19937 gen(11);
  std::exponential_distribution<float> expo(300.0f);
  std::vector<float> x(1000003);
  for (float& v : x) v = (gen() % 2 ? 1 : -1) * expo(gen);
  for (size_t i = 0; i < x.size(); i += 997) x[i] = 0;
  x[17] = -std::numeric_limits<float>::infinity();
  x[18] = std::numeric_limits<float>::quiet_NaN();
  auto d = gpu->AllocScratch(x.size() * 4);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(gpu->CopyFromHost((*d)->data(), x.data(), x.size() * 4).ok());
  const float* dx = static_cast<const float*>((*d)->data());
  for (size_t begin : {size_t{0}, size_t{333}}) {
    for (uint32_t first : {0u, 0x3800u, 0x3b00u, 0xFF00u}) {
      for (uint64_t quota : {uint64_t{1}, uint64_t{10000}, uint64_t{250000}, uint64_t{2000000}}) {
        SCOPED_TRACE(::testing::Message() << begin << " " << first << " " << quota);
        auto want = cpu->AbsHistogramEdge(x.data(), begin, x.size(), first, quota);
        auto got = gpu->AbsHistogramEdge(dx, begin, x.size(), first, quota);
        ASSERT_TRUE(want.ok() && got.ok()) << got.status();
        EXPECT_EQ(got->bin, want->bin);
        EXPECT_EQ(got->reached, want->reached);
        EXPECT_EQ(got->cum, want->cum);
        EXPECT_EQ(got->in_edge, want->in_edge);
      }
    }
  }
  auto staging = gpu->AllocHostStaging(4096);
  ASSERT_TRUE(staging.ok()) << staging.status();
  ASSERT_TRUE(gpu->CopyToHost((*staging)->data(), dx, 4096).ok());
  EXPECT_EQ(std::memcmp((*staging)->data(), x.data(), 4096), 0);
}

}  // namespace
}  // namespace spex
