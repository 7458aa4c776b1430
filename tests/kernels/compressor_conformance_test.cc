// One conformance suite instantiated for every registered compressor (and for micro/exdyna under
// both threshold controls): 4 nodes simulated in-process (each with its own ErrorFeedback and
// compressor; the gathered data of every step built here as the engine would), on Gaussian,
// Laplace and heavy-tailed (Student-t, 3 dof) gradients. Checks: indices in range, unique and
// ascending; values equal acc at those indices; acc_before = sent + residual exactly for the
// compressor's pattern; achieved density within the compressor's stated band after warm-up;
// the same seed gives the same output; registry errors.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/cpu/cpu_primitives.h"
#include "kernels/error_feedback.h"
#include "kernels/primitives.h"
#include "tests/support/forwarding_primitives.h"

namespace spex {
namespace {

enum class Dist { kGaussian, kLaplace, kStudentT };
const char* DistName(Dist d) {
  return d == Dist::kGaussian ? "gaussian" : d == Dist::kLaplace ? "laplace" : "student_t3";
}

// Which count the density band applies to.
enum class Scope {
  kPerNode,  // each node's own count against k (B compressors, topk_union)
  kGlobal,   // the sum over nodes against k (exclusive selections: micro, exdyna, cltk, deft)
  kNone,     // density is not controlled (dense, thresh, the published controller)
};

struct Case {
  std::string label;  // test name
  std::string name;   // registry name
  std::map<std::string, std::string> params;
  Scope scope;
  double lo, hi;  // band for mean(count / k) over the steps after warm-up
  const char* why = "";
  // Scale the inputs so that 1 / (2 sqrt(k)), the initial threshold, is the target quantile of
  // |gradient| (for controllers that start there and correct slowly, as SAGE).
  bool calibrate = false;
};

// The stated bands. Exact selectors meet k exactly; estimators get the band their algorithm
// promises (DGC keeps at most 4k/3 and corrects into [0.7, 1.3]k; Gaussian-k refines into
// [2/3, 4/3]k; RedSync searches into (k, 2k); RedSync-trim keeps the top-k of its candidates;
// SAGE only corrects 10x misses; ...).
std::vector<Case> Cases() {
  return {
      {"dense", "dense", {}, Scope::kNone, 0, 0, "sends everything"},
      {"topk", "topk", {}, Scope::kPerNode, 1, 1},
      {"gtopk", "gtopk", {}, Scope::kPerNode, 1, 1},
      {"topk_union", "topk_union", {}, Scope::kPerNode, 1, 1},
      {"randomk", "randomk", {{"seed", "7"}}, Scope::kPerNode, 1, 1},
      {"cltk", "cltk", {}, Scope::kGlobal, 1, 1},
      {"thresh", "thresh", {}, Scope::kNone, 0, 0, "a fixed threshold: density follows the scale"},
      // At most 4k/3 (trim); x1.3 / x0.7 steps can end below 0.7k after 10 rounds on a thin tail.
      {"dgc", "dgc", {{"seed", "7"}}, Scope::kPerNode, 0.3, 4.0 / 3.0},
      // The published refinements, then bisection until the count is inside the band.
      {"gaussiank", "gaussiank", {}, Scope::kPerNode, 2.0 / 3.0, 4.0 / 3.0},
      {"redsync", "redsync", {}, Scope::kPerNode, 1, 2},
      {"redsync_trim", "redsync_trim", {}, Scope::kPerNode, 1, 1},
      // The published loops stop after 3 (5) probes wherever the count is.
      {"gaussiank_reference", "gaussiank", {{"refine", "reference"}}, Scope::kPerNode, 0.3, 1.5},
      {"redsync_reference", "redsync", {{"search", "reference"}}, Scope::kPerNode, 0.05, 3},
      {"redsync_trim_untrimmed", "redsync_trim", {{"trim", "false"}}, Scope::kPerNode, 1, 200},
      {"sidco_e", "sidco_e", {}, Scope::kPerNode, 0.4, 2.5},
      {"sidco_p", "sidco_p", {}, Scope::kPerNode, 0.4, 2.5},
      {"sidco_gp", "sidco_gp", {}, Scope::kPerNode, 0.4, 2.5},
      {"micro", "micro", {}, Scope::kGlobal, 0.999, 1.001},
      {"micro_reference",
       "micro",
       {{"threshold_control", "reference"}},
       Scope::kNone,
       0,
       0,
       "the published controller moves 0.5% per step (benchmarked, not banded here)"},
      {"micro_untrimmed", "micro", {{"histogram_trim", "false"}}, Scope::kGlobal, 1, 1.25},
      {"exdyna", "exdyna", {}, Scope::kGlobal, 0.999, 1.001},
      {"exdyna_reference",
       "exdyna",
       {{"threshold_control", "reference"}},
       Scope::kNone,
       0,
       0,
       "the published controller moves 0.5% per step (benchmarked, not banded here)"},
      // SAGE corrects only 10x misses (5% per step) and the drift of mean |acc|.
      {"sage", "sage", {{"seed", "7"}}, Scope::kPerNode, 0.1, 10, "", true},
      {"deft", "deft", {}, Scope::kGlobal, 0.8, 1.3},
  };
}

constexpr int kNodes = 4;
constexpr size_t kN = (1u << 17) + 12345;
constexpr int kSteps = 24;
constexpr int kWarmup = 8;

// A pool of 4 kN values per distribution; the gradient of (node, step) is a window into it.
const std::vector<float>& Pool(Dist d) {
  static std::map<Dist, std::vector<float>> pools;
  auto it = pools.find(d);
  if (it != pools.end()) return it->second;
  std::mt19937 gen(1234 + static_cast<int>(d));
  std::vector<float> x(4 * kN);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::exponential_distribution<float> expo(1e3f);
  std::student_t_distribution<float> t3(3.0f);
  std::bernoulli_distribution sign(0.5);
  for (float& v : x) {
    switch (d) {
      case Dist::kGaussian:
        v = normal(gen);
        break;
      case Dist::kLaplace:
        v = (sign(gen) ? 1 : -1) * expo(gen);
        break;
      case Dist::kStudentT:
        v = 1e-3f * t3(gen);
        break;
    }
  }
  return pools.emplace(d, std::move(x)).first->second;
}
const float* Grad(Dist d, int node, int step) {
  const size_t off =
      (static_cast<size_t>(node) * 7919 + static_cast<size_t>(step) * 104729) % (3 * kN);
  return Pool(d).data() + off;
}

struct Result {
  std::vector<std::vector<uint32_t>> all_idx;  // every node's selection of every step
  std::vector<double> ratio;                   // per step: count / k in the case's scope
};

// Runs `steps` steps of `nodes` simulated nodes and checks the per-step invariants.
void Simulate(const Case& c, Dist dist, double density, int steps, Primitives* prims, Result* out,
              int nodes = kNodes) {
  Result& res = *out;
  std::vector<std::unique_ptr<Compressor>> comp;
  std::vector<std::unique_ptr<ErrorFeedback>> ef;
  for (int r = 0; r < nodes; ++r) {
    CompressorSpec spec{c.name, density, c.params, r, nodes, kN};
    auto made = MakeCompressor(spec, prims);
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return;
    comp.push_back(std::move(*made));
    ef.push_back(std::make_unique<ErrorFeedback>(prims, kN));
  }
  const Pattern pattern = comp[0]->pattern();
  const size_t k = std::max<size_t>(1, static_cast<size_t>(std::floor(density * kN)));
  float scale = 1.0f;
  if (c.calibrate) {
    std::vector<float> mag(Pool(dist).begin(), Pool(dist).begin() + kN);
    for (float& v : mag) v = std::fabs(v);
    std::nth_element(mag.begin(), mag.begin() + (k - 1), mag.end(), std::greater<float>());
    scale = static_cast<float>(1.0 / (2.0 * std::sqrt(static_cast<double>(k))) / mag[k - 1]);
  }
  std::vector<float> scaled(kN);
  std::vector<std::vector<float>> before(nodes);
  std::vector<Selection> sel(nodes);
  for (int step = 0; step < steps; ++step) {
    std::vector<uint64_t> counts(nodes);
    std::vector<uint32_t> gathered;
    for (int r = 0; r < nodes; ++r) {
      const float* g = Grad(dist, r, step);
      if (scale != 1.0f) {
        for (size_t i = 0; i < kN; ++i) scaled[i] = g[i] * scale;
        g = scaled.data();
      }
      before[r].assign(ef[r]->acc(), ef[r]->acc() + kN);
      for (size_t i = 0; i < kN; ++i) before[r][i] += g[i];
      const absl::Status s = ef[r]->Select(comp[r].get(), step, g, &sel[r]);
      EXPECT_TRUE(s.ok()) << s;
      const Selection& q = sel[r];
      if (pattern == Pattern::kDense) {
        EXPECT_TRUE(q.all);
        ASSERT_EQ(q.val.size(), kN);
        EXPECT_EQ(0, std::memcmp(q.val.data(), before[r].data(), kN * sizeof(float)))
            << "dense must send acc as it was";
      } else {
        EXPECT_FALSE(q.all);
        ASSERT_EQ(q.idx.size(), q.val.size());
        for (size_t j = 0; j < q.idx.size(); ++j) {
          ASSERT_LT(q.idx[j], kN) << "index out of range";
          if (j > 0) {
            ASSERT_LT(q.idx[j - 1], q.idx[j]) << "indices must ascend, unique";
          }
          ASSERT_EQ(q.val[j], before[r][q.idx[j]]) << "value differs from acc at " << q.idx[j];
        }
      }
      counts[r] = q.count();
      gathered.insert(gathered.end(), q.idx.begin(), q.idx.end());
      res.all_idx.push_back(q.idx);
    }
    if (pattern == Pattern::kIndexUnion) {
      std::sort(gathered.begin(), gathered.end());
      gathered.erase(std::unique(gathered.begin(), gathered.end()), gathered.end());
    }
    std::vector<std::vector<float>> contributed(nodes);
    for (int r = 0; r < nodes; ++r) {
      if (pattern == Pattern::kIndexUnion) {
        contributed[r].resize(gathered.size());
        ASSERT_TRUE(ef[r]->GatherAt(gathered, contributed[r].data()).ok());
      }
      Gathered g{counts, pattern == Pattern::kDense ? absl::Span<const uint32_t>() : gathered};
      const absl::Status s = ef[r]->Complete(comp[r].get(), step, g);
      ASSERT_TRUE(s.ok()) << s;
    }
    // acc_before = sent + residual, exactly, per node.
    for (int r = 0; r < nodes; ++r) {
      std::vector<float> sent(kN, 0.0f);
      if (pattern == Pattern::kDense) {
        sent = sel[r].val;
      } else if (pattern == Pattern::kSparseGather) {
        for (size_t j = 0; j < sel[r].idx.size(); ++j) sent[sel[r].idx[j]] = sel[r].val[j];
      } else {
        for (size_t j = 0; j < gathered.size(); ++j) sent[gathered[j]] = contributed[r][j];
      }
      const float* res_acc = ef[r]->acc();
      for (size_t i = 0; i < kN; ++i) {
        if (sent[i] != 0.0f) {
          ASSERT_EQ(res_acc[i], 0.0f) << "sent position " << i << " not zeroed";
        }
        ASSERT_EQ(sent[i] + res_acc[i], before[r][i]) << "node " << r << " position " << i;
      }
    }
    double ratio = 0;
    if (c.scope == Scope::kPerNode) {
      for (int r = 0; r < nodes; ++r) ratio += static_cast<double>(counts[r]) / k / nodes;
    } else {
      for (int r = 0; r < nodes; ++r) ratio += static_cast<double>(counts[r]) / k;
    }
    res.ratio.push_back(ratio);
  }
}

class Conformance : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { prims_ = MakeCpuPrimitives(1); }
  std::unique_ptr<Primitives> prims_;
};

TEST_P(Conformance, InvariantsAndDensityBand) {
  const Case& c = GetParam();
  for (double density : {0.01, 0.001}) {
    for (Dist dist : {Dist::kGaussian, Dist::kLaplace, Dist::kStudentT}) {
      SCOPED_TRACE(testing::Message() << c.label << " d=" << density << " " << DistName(dist));
      Result res;
      Simulate(c, dist, density, kSteps, prims_.get(), &res);
      if (HasFatalFailure()) return;
      double mean = 0;
      for (int s = kWarmup; s < kSteps; ++s) mean += res.ratio[s] / (kSteps - kWarmup);
      std::printf("%-18s d=%-6g %-10s achieved/target %.4f\n", c.label.c_str(), density,
                  DistName(dist), mean);
      if (c.scope == Scope::kNone) continue;
      EXPECT_GE(mean, c.lo) << "achieved/target below the band";
      EXPECT_LE(mean, c.hi) << "achieved/target above the band";
    }
  }
}

TEST_P(Conformance, SameSeedSameOutput) {
  const Case& c = GetParam();
  Result a, b;
  Simulate(c, Dist::kLaplace, 0.01, 6, prims_.get(), &a);
  Simulate(c, Dist::kLaplace, 0.01, 6, prims_.get(), &b);
  ASSERT_FALSE(a.all_idx.empty());
  EXPECT_EQ(a.all_idx, b.all_idx);
}

TEST_P(Conformance, SingleNodeAndTinyBuckets) {
  // One node (no peers: controllers count locally), and buckets smaller than a node count.
  const Case& c = GetParam();
  Result res;
  Simulate(c, Dist::kGaussian, 0.01, 5, prims_.get(), &res, 1);
  EXPECT_EQ(res.ratio.size(), 5u);
  for (size_t n : {1, 3, 40}) {
    CompressorSpec spec{c.name, 0.5, c.params, 0, 2, n};
    auto made = MakeCompressor(spec, prims_.get());
    if (!made.ok()) {
      // Only exdyna may refuse (it needs a block per node), and it must say why.
      EXPECT_EQ(c.name, "exdyna");
      EXPECT_NE(std::string(made.status().message()).find("blocks"), std::string::npos);
      continue;
    }
    std::vector<float> acc(n, 0.0f), g(n);
    for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>(i % 5) - 2.0f;
    Selection sel;
    ASSERT_TRUE((*made)->Select(0, acc.data(), g.data(), false, &sel).ok());
    for (uint32_t i : sel.idx) EXPECT_LT(i, n);
  }
}

TEST_P(Conformance, AllZeroInputSelectsNoNonZero) {
  const Case& c = GetParam();
  CompressorSpec spec{c.name, 0.01, c.params, 0, 1, 5000};
  auto made = MakeCompressor(spec, prims_.get());
  ASSERT_TRUE(made.ok()) << made.status();
  ErrorFeedback ef(prims_.get(), 5000);
  Selection sel;
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(ef.Select(made->get(), step, nullptr, &sel).ok());
    for (float v : sel.val) EXPECT_EQ(v, 0.0f);
    for (float s : sel.scalars) EXPECT_FALSE(std::isnan(s)) << "NaN scalar on zero input";
    const std::vector<uint64_t> counts{sel.count()};
    Gathered g{counts, sel.idx};
    ASSERT_TRUE(ef.Complete(made->get(), step, g).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(AllCompressors, Conformance, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.label; });

TEST(Registry, EveryNameIsCoveredAndPatternsMatchTheDecisions) {
  std::vector<std::string> covered;
  for (const Case& c : Cases()) covered.push_back(c.name);
  for (const std::string& name : CompressorNames()) {
    EXPECT_NE(std::find(covered.begin(), covered.end(), name), covered.end())
        << name << " is not in the conformance suite";
  }
  const std::map<std::string, Pattern> expected = {
      {"micro", Pattern::kIndexUnion},          {"exdyna", Pattern::kIndexUnion},
      {"thresh", Pattern::kIndexUnion},         {"topk_union", Pattern::kIndexUnion},
      {"cltk", Pattern::kIndexUnion},           {"deft", Pattern::kIndexUnion},
      {"topk", Pattern::kSparseGather},         {"gtopk", Pattern::kSparseGather},
      {"randomk", Pattern::kSparseGather},      {"dgc", Pattern::kSparseGather},
      {"gaussiank", Pattern::kSparseGather},    {"redsync", Pattern::kSparseGather},
      {"redsync_trim", Pattern::kSparseGather}, {"sidco_e", Pattern::kSparseGather},
      {"sidco_p", Pattern::kSparseGather},      {"sidco_gp", Pattern::kSparseGather},
      {"sage", Pattern::kSparseGather},         {"dense", Pattern::kDense},
  };
  EXPECT_EQ(CompressorNames().size(), expected.size());
  for (const auto& [name, p] : expected) {
    auto got = CompressorPattern(name);
    ASSERT_TRUE(got.ok()) << name;
    EXPECT_EQ(*got, p) << name;
  }
}

TEST(Registry, RejectsBadSpecsWithWhatIsAccepted) {
  auto prims = MakeCpuPrimitives(1);
  auto make = [&](CompressorSpec s) { return MakeCompressor(s, prims.get()).status(); };
  absl::Status s = make({"nope", 0.01, {}, 0, 1, 100});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("micro"), std::string::npos) << s;
  s = make({"micro", 0.01, {{"threshold_control", "magic"}}, 0, 1, 100});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("reference|histogram"), std::string::npos) << s;
  s = make({"topk", 0.01, {{"sed", "3"}}, 0, 1, 100});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("takes no parameters"), std::string::npos) << s;
  s = make({"randomk", 0.01, {{"sed", "3"}}, 0, 1, 100});
  EXPECT_NE(std::string(s.message()).find("accepted: seed"), std::string::npos) << s;
  s = make({"dgc", 0.01, {{"sample_ratio", "2"}}, 0, 1, 100});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(make({"topk", 0.0, {}, 0, 1, 100}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(make({"topk", 1.5, {}, 0, 1, 100}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(make({"topk", 0.1, {}, 2, 2, 100}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(make({"topk", 0.1, {}, 0, 1, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateCompressor("sidco_gp", 0.001, {{"stages", "3"}, {"adaptive", "false"}}).ok());
  EXPECT_FALSE(ValidateCompressor("sidco_gp", 0.001, {{"stages", "0"}}).ok());
  EXPECT_TRUE(ValidateCompressor("redsync", 0.001, {{"search", "reference"}}).ok());
  EXPECT_FALSE(ValidateCompressor("redsync", 0.001, {{"search", "binary"}}).ok());
  EXPECT_FALSE(ValidateCompressor("redsync", 0.001, {{"trim", "false"}}).ok()) << "trim's";
  EXPECT_TRUE(ValidateCompressor("redsync_trim", 0.001, {{"trim", "false"}}).ok());
  EXPECT_TRUE(ValidateCompressor("gaussiank", 0.001, {{"refine", "reference"}}).ok());
  EXPECT_FALSE(ValidateCompressor("gaussiank", 0.001, {{"refine", "5"}}).ok());
}

// CPU primitives that claim to be a GPU's.
class DevicePrimitives : public test::ForwardingPrimitives {
 public:
  DevicePrimitives() : ForwardingPrimitives(MakeCpuPrimitives(1)) {}
  Device device() const override { return Device::kCuda; }
};

// Every sparse compressor runs on device scratch and is built on device primitives (their device
// runs are compared with the CPU in tests/cuda/device_compressor_test.cc); the registry's dense
// entry (the engine exchanges dense buckets without a compressor) is refused there, naming
// itself and the ones that run there.
TEST(Registry, UnportedCompressorsAreRefusedClearlyOnDevicePrimitives) {
  DevicePrimitives gpu;
  const std::vector<std::string> ported = DeviceCompressorNames();
  EXPECT_EQ(ported, (std::vector<std::string>{"cltk", "deft", "dgc", "exdyna", "gaussiank", "gtopk",
                                              "micro", "randomk", "redsync", "redsync_trim", "sage",
                                              "sidco_e", "sidco_gp", "sidco_p", "thresh", "topk",
                                              "topk_union"}));
  for (const std::string& name : CompressorNames()) {
    auto made = MakeCompressor({name, 0.01, {}, 0, 1, 1000}, &gpu);
    if (CompressorRunsOnDevice(name)) {
      EXPECT_TRUE(made.ok()) << name << ": " << made.status();
      continue;
    }
    EXPECT_EQ(made.status().code(), absl::StatusCode::kUnimplemented) << name;
    const std::string msg(made.status().message());
    EXPECT_EQ(msg.rfind(name + ": does not run on device", 0), 0u) << msg;
    EXPECT_NE(msg.find("host-memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cltk, deft, dgc, exdyna, gaussiank, gtopk, micro, randomk, redsync, "
                       "redsync_trim, sage, sidco_e, sidco_gp, sidco_p, thresh, topk, "
                       "topk_union"),
              std::string::npos)
        << msg;
  }
  EXPECT_FALSE(CompressorRunsOnDevice("dense"));
  EXPECT_EQ(ported.size() + 1, CompressorNames().size());
}

TEST(Compressor, SetDensityTakesEffectNextStepAndIsValidated) {
  auto prims = MakeCpuPrimitives(1);
  auto c = MakeCompressor({"topk", 0.01, {}, 0, 1, 10000}, prims.get());
  ASSERT_TRUE(c.ok());
  std::vector<float> acc(10000);
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = static_cast<float>((i * 7919) % 10007);
  Selection sel;
  ASSERT_TRUE((*c)->Select(0, acc.data(), nullptr, false, &sel).ok());
  EXPECT_EQ(sel.idx.size(), 100u);
  ASSERT_TRUE((*c)->SetDensity(0.001).ok());
  ASSERT_TRUE((*c)->Select(1, acc.data(), nullptr, false, &sel).ok());
  EXPECT_EQ(sel.idx.size(), 10u);
  EXPECT_FALSE((*c)->SetDensity(0).ok());
  EXPECT_FALSE((*c)->SetDensity(2).ok());
  EXPECT_DOUBLE_EQ((*c)->density(), 0.001);
}

TEST(Compressor, RejectsZeroSelectedForPatternAAndBadGatheredShapes) {
  auto prims = MakeCpuPrimitives(1);
  auto c = MakeCompressor({"micro", 0.01, {}, 0, 2, 1000}, prims.get());
  ASSERT_TRUE(c.ok());
  std::vector<float> acc(1000, 1.0f);
  Selection sel;
  EXPECT_EQ((*c)->Select(0, acc.data(), nullptr, true, &sel).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<uint64_t> one{3};
  const std::vector<uint64_t> two{2, 1};
  const std::vector<uint32_t> unsorted{5, 4, 9};
  const std::vector<uint32_t> outside{1, 2, 1000};
  EXPECT_FALSE((*c)->Update(0, {one, {}}).ok()) << "count per node";
  EXPECT_FALSE((*c)->Update(0, {two, unsorted}).ok()) << "union must be sorted";
  EXPECT_FALSE((*c)->Update(0, {two, outside}).ok()) << "index out of range";
  auto b = MakeCompressor({"topk", 0.01, {}, 0, 2, 1000}, prims.get());
  ASSERT_TRUE(b.ok());
  const std::vector<uint32_t> two_idx{1, 2};
  EXPECT_FALSE((*b)->Update(0, {two, two_idx}).ok()) << "B: indices must match the counts";
}

}  // namespace
}  // namespace spex
