// Every registered compressor inside the engine, 2 and 4 nodes (threads over the in-process
// collective) x 2 trainers per node, several steps. Each trainer's result must equal the
// oracle of kernels/reference_cluster.h (A: the exact average over the union; B: the sum of
// every node's selection over N*L; D: the exact average) fed with the same inputs, and the
// residual every node keeps (its norm, reported per step) must equal the oracle's: exactly what
// was not sent. The clusters are those of tests/support/engine_cluster.h.
#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "daemon/engine/engine.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/reference/reference_primitives.h"
#include "kernels/reference_cluster.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/reference_oracle.h"
#include "tests/support/synthetic_gradient.h"

namespace spex::test {
namespace {

// Roughly Gaussian, with a per-position scale every node shares (a spike every 97th position, a
// slow drift), so that thresholds see structure that persists across steps
// (tests/support/synthetic_gradient.h).
float Value(int node, int trainer, uint64_t step, size_t i) {
  return Gradient({node, trainer, 0, step, i},
                  {GradientShape::kGaussian, 1e-3, 97, 4.0, /*drift=*/true});
}

struct Case {
  std::string compressor;
  int nodes;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return info.param.compressor + "_" + std::to_string(info.param.nodes) + "nodes";
}

class CompressorEngineTest : public ::testing::TestWithParam<Case> {};

TEST_P(CompressorEngineTest, EveryTrainerGetsTheOracleResult) {
  const Case& c = GetParam();
  const int N = c.nodes, L = 2, steps = 6;
  const size_t n = 30011;
  const double density = 0.01;
  auto prims = MakeReferencePrimitives();
  auto pattern = CompressorPattern(c.compressor);
  ASSERT_TRUE(pattern.ok()) << pattern.status();

  // The oracle, run first over the same inputs.
  CompressorSpec spec;
  spec.name = c.compressor;
  spec.density = density;
  spec.elements = n;
  auto oracle = RunReferenceCluster(spec, N, L, steps, prims.get(), Value);
  ASSERT_TRUE(oracle.ok()) << oracle.status();

  EngineClusterOptions o = AlwaysSparseCluster(N, L, "comptest");
  o.engine.residual_norm_every = 1;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  // Residual norms: the first trainer of each node, for the sparse patterns.
  ExpectJobMatchesOracle(
      cluster, L, c.compressor, density, *pattern, *oracle, Value, [](int) { return -1; },
      [&](int, int t) { return t == 0 && *pattern != Pattern::kDense; });
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const std::string& name : CompressorNames()) {
    for (int nodes : {2, 4}) cases.push_back({name, nodes});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllCompressors, CompressorEngineTest, ::testing::ValuesIn(AllCases()),
                         CaseName);

TEST(CompressorEngineErrors, UnknownCompressorAndBadParameterNameWhatToFix) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.hub_timeout = absl::Seconds(5);
  o.engine.shm_tag = "comptest";
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  Engine& e = cluster.engine(0);
  auto hello = e.Hello("", 0, 1, 0, "t");
  ASSERT_TRUE(hello.ok());
  auto g = e.RegisterBucket(hello->session_id, 1, 100000, "mikro", 0.01);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("unknown compressor 'mikro'"), std::string::npos)
      << g.status();
  EXPECT_NE(g.status().message().find("micro"), std::string::npos)
      << "lists the accepted names: " << g.status();
  g = e.RegisterBucket(hello->session_id, 1, 100000, "micro", 0.01,
                       {{"threshold_control", "guess"}});
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("threshold_control"), std::string::npos) << g.status();
  // The engine keeps serving: a good registration of the same id then works.
  g = e.RegisterBucket(hello->session_id, 1, 100000, "micro", 0.01,
                       {{"threshold_control", "histogram"}});
  EXPECT_TRUE(g.ok()) << g.status();
}

TEST(CompressorEngineErrors, NodesDisagreeingOnABucketsCompressorGetAClearError) {
  EngineClusterOptions o;
  o.nodes = 2;
  o.hub_timeout = absl::Seconds(10);
  o.engine.shm_tag = "comptest";
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<absl::Status> results(2);
  cluster.ForEachNode([&](int r) {
    auto t = Trainer::Open(&cluster.engine(r), 0, 1);
    ASSERT_TRUE(t.ok());
    auto g = t->Register(3, 50000, r == 0 ? "micro" : "topk", 0.01);
    ASSERT_TRUE(g.ok()) << g.status();
    results[r] = t->Exchange(3, 0, absl::Seconds(10)).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
    EXPECT_NE(results[r].message().find("same compressor"), std::string::npos) << results[r];
  }
}

}  // namespace
}  // namespace spex::test
