// What a sparse step moves between the device and the host (issue 33 item 3), on the fake
// device, which counts every device-to-host and host-to-device copy of the device primitives:
//  - micro and exdyna (histogram control, trimmed and not) and topk select on the device's
//    primitives bit-identically to the CPU primitives, while each Select copies out only the
//    selected pairs, once, into pinned host staging (8 bytes a pair) plus the histogram edge
//    (24 bytes per walk, at most two walks): never the 2^16 histogram bins, nothing uploaded;
//  - through the engine (2 nodes x 2 trainers), the bytes a sparse step moves grow with k and
//    not with the bucket: the same k in a bucket 4x larger moves the same bytes, twice the k
//    about twice the bytes, and every step stays under a bound linear in k.
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/engine.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "tests/cuda/compressor_cases.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/fake_device.h"
#include "tests/support/synthetic_gradient.h"

namespace spex {
namespace {

using fake::FakeDevice;

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

struct Config {
  std::string label, name;
  std::map<std::string, std::string> params;
};

std::vector<Config> Configs() {
  return {{"micro", "micro", {}},
          {"micro_untrimmed", "micro", {{"histogram_trim", "false"}}},
          {"exdyna", "exdyna", {}},
          {"topk", "topk", {}}};
}

class SelectTraffic : public ::testing::TestWithParam<Config> {};

TEST_P(SelectTraffic, OnlyTheSelectedPairsComeOutInOneCopyToPinnedStaging) {
  const Config& c = GetParam();
  constexpr int kNodes = 4, kSteps = 5;
  constexpr size_t kN = 400009;  // 6x the histogram's 2^16 bins
  FakeDevice device;
  std::unique_ptr<Primitives> cpu = MakeCpuPrimitives(1);
  for (int r = 0; r < kNodes; ++r) {
    SCOPED_TRACE(::testing::Message() << c.label << " rank " << r);
    const CompressorSpec spec{c.name, 0.01, c.params, r, kNodes, kN};
    auto on_cpu = MakeCompressor(spec, cpu.get());
    auto on_dev = MakeCompressor(spec, device.device_prims());
    ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
    ASSERT_TRUE(on_dev.ok()) << on_dev.status();
    std::vector<float> acc_cpu = testcases::Data(kN, 100 + r);
    auto acc_dev = device.AllocateScratch(kN * 4);
    ASSERT_TRUE(acc_dev.ok());
    std::memcpy((*acc_dev)->data(), acc_cpu.data(), kN * 4);
    const bool zero = (*on_cpu)->pattern() == Pattern::kSparseGather;
    for (int step = 0; step < kSteps; ++step) {
      Selection a, b;
      ASSERT_TRUE((*on_cpu)->Select(step, acc_cpu.data(), nullptr, zero, &a).ok());
      const fake::Staging before = device.staging();
      const absl::Status s =
          (*on_dev)->Select(step, static_cast<float*>((*acc_dev)->data()), nullptr, zero, &b);
      const fake::Staging after = device.staging();
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(b.idx, a.idx) << "step " << step;
      EXPECT_TRUE(SameBits(b.val, a.val)) << "step " << step;
      ASSERT_GT(b.idx.size(), 0u);
      const uint64_t pairs = 8 * b.idx.size();
      const uint64_t to_host = after.to_host_bytes - before.to_host_bytes;
      // The pairs, into pinned staging, in one copy; besides them at most two histogram edges.
      EXPECT_EQ(after.to_pinned_bytes - before.to_pinned_bytes, pairs) << "step " << step;
      EXPECT_GE(after.to_host_sizes.count(pairs), 1u) << "no single copy of all the pairs";
      EXPECT_LE(to_host, pairs + 2 * sizeof(HistogramEdge)) << "step " << step;
      EXPECT_EQ(after.from_host_bytes, before.from_host_bytes) << "step " << step;
      // Update with this node's selection alone, zeroing at it as the engine zeroes the union.
      Gathered g;
      std::vector<uint64_t> counts(kNodes, 0);
      counts[r] = a.idx.size();
      g.counts = counts;
      g.indices = a.idx;
      ASSERT_TRUE((*on_cpu)->Update(step, g).ok());
      ASSERT_TRUE((*on_dev)->Update(step, g).ok());
      if (!zero) {
        ASSERT_TRUE(cpu->ZeroAt(acc_cpu.data(), kN, a.idx.data(), a.idx.size()).ok());
        ASSERT_TRUE(
            cpu->ZeroAt(static_cast<float*>((*acc_dev)->data()), kN, a.idx.data(), a.idx.size())
                .ok());
      }
      // New gradient mass, so the next step selects again.
      const std::vector<float> add = testcases::Data(kN, 1000 * step + r);
      for (size_t i = 0; i < kN; ++i) acc_cpu[i] += add[i];
      std::memcpy((*acc_dev)->data(), acc_cpu.data(), kN * 4);
    }
  }
  EXPECT_LT(device.staging().to_host_max_bytes, Primitives::kHistogramBins * 4 / 8);
  for (const std::string& v : device.violations()) ADD_FAILURE() << v;
}

INSTANTIATE_TEST_SUITE_P(Histogram, SelectTraffic, ::testing::ValuesIn(Configs()),
                         [](const ::testing::TestParamInfo<Config>& i) { return i.param.label; });

// Bytes moved between device and host per sparse step, summed over the nodes, through engines
// on fake devices (2 nodes x 2 trainers, one bucket of n elements, k = density * n), after a
// first step that sizes the scratch and staging.
double BytesPerStep(const std::string& compressor, size_t n, size_t k) {
  constexpr int kNodes = 2, kTrainers = 2, kSteps = 5;
  constexpr uint64_t kBucket = 3;
  std::vector<std::unique_ptr<FakeDevice>> devices;
  for (int i = 0; i < kNodes; ++i) devices.push_back(std::make_unique<FakeDevice>(0, 1));
  test::EngineClusterOptions o;
  o.nodes = kNodes;
  o.trainers = kTrainers;
  o.engine.shm_tag = "devtraffic";
  o.engine.min_sparse_elements = 0;
  o.engine.dense_fallback = DenseFallback::kOff;
  o.parts = [&devices](int r) {
    return test::NodeParts{devices[r]->device_prims(), devices[r]->path()};
  };
  o.wrap = [&devices](int r, std::unique_ptr<Collective> c) {
    return fake::CheckedCollective(std::move(c), devices[r].get());
  };
  std::vector<uint64_t> after_first(kNodes, 0), at_end(kNodes, 0);
  {
    test::EngineCluster cluster(o);
    EXPECT_TRUE(cluster.status().ok()) << cluster.status();
    if (!cluster.status().ok()) return -1;
    const double density = static_cast<double>(k) / static_cast<double>(n);
    cluster.ForEachTrainer([&](int node, int t) {
      auto tr = test::Trainer::Open(&cluster.engine(node), t, kTrainers);
      ASSERT_TRUE(tr.ok()) << tr.status();
      ASSERT_TRUE(tr->Register(kBucket, n, compressor, density).ok());
      for (int s = 0; s < kSteps; ++s) {
        tr->Fill(kBucket, [&](size_t i) {
          return test::Gradient({node, t, kBucket, static_cast<uint64_t>(s), i},
                                {test::GradientShape::kUniform, 2e-3, 0, 0.0});
        });
        auto rec = tr->Exchange(kBucket, s);
        ASSERT_TRUE(rec.ok()) << rec.status();
        EXPECT_NE(rec->pattern, "D");
        if (t == 0 && s == 0) {
          const fake::Staging st = devices[node]->staging();
          after_first[node] = st.to_host_bytes + st.from_host_bytes;
        }
      }
    });
    for (int i = 0; i < kNodes; ++i) {
      const fake::Staging st = devices[i]->staging();
      at_end[i] = st.to_host_bytes + st.from_host_bytes;
      for (const std::string& v : devices[i]->violations()) ADD_FAILURE() << v;
    }
  }
  uint64_t total = 0;
  for (int i = 0; i < kNodes; ++i) total += at_end[i] - after_first[i];
  return static_cast<double>(total) / (kSteps - 1);
}

class StepTraffic : public ::testing::TestWithParam<std::string> {};

TEST_P(StepTraffic, GrowsWithKNotWithTheBucket) {
  const std::string& name = GetParam();
  constexpr size_t kSmall = 100003, kLarge = 400009, kK = 500;
  const double small = BytesPerStep(name, kSmall, kK);
  const double large = BytesPerStep(name, kLarge, kK);
  const double twice_k = BytesPerStep(name, kSmall, 2 * kK);
  ASSERT_GT(small, 0);
  // Per selected element per node: the pair out (8), the sum at the union read back (4), the
  // gathered pairs in (8 per node's pair) and the union's indices in to zero (4), with room for
  // the edges and counts: 64 bytes of k per node is generous and far below the histogram's
  // 256 KiB per node and step this replaced.
  const double bound = 2 * (64.0 * kK + 4096);
  EXPECT_LT(small, bound) << name;
  EXPECT_LT(large, bound) << name;
  EXPECT_LT(large, 1.1 * small) << name << ": a 4x larger bucket with the same k";
  EXPECT_GT(large, 0.9 * small) << name;
  EXPECT_GT(twice_k / small, 1.6) << name << ": twice the k";
  EXPECT_LT(twice_k / small, 2.4) << name;
  std::printf("%s bytes per step: n=%zu k=%zu: %.0f; n=%zu: %.0f; k=%zu: %.0f\n", name.c_str(),
              kSmall, kK, small, kLarge, large, 2 * kK, twice_k);
}

INSTANTIATE_TEST_SUITE_P(Compressors, StepTraffic, ::testing::Values("micro", "exdyna", "topk"));

}  // namespace
}  // namespace spex
