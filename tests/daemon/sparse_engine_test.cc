// The sparse exchange inside the engine, over the in-process collective (N nodes as threads,
// L trainers per node, the fixture of tests/support/engine_cluster.h), with test compressors of
// both wire patterns. Every trainer's result must equal a reference computed from all inputs
// with the pattern's semantics, and the residual must carry exactly what was not sent:
//   A (index union): out[i] = sum over nodes of acc_node[i] / (N L) on the union, 0 elsewhere;
//                    every node's residual is zeroed on the whole union.
//   B (sparse gather): out = sum over nodes of acc_node restricted to its selection / (N L);
//                    each node's residual is zeroed on its own selection.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "daemon/engine/engine.h"
#include "daemon/engine/wire.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/reference/reference_primitives.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/forwarding_collective.h"
#include "tests/support/synthetic_gradient.h"

namespace spex::test {
namespace {

// Pattern B: exact top-k of the whole bucket. Pattern A ("partition"): each node takes the
// top-k of the partition it owns this step (ownership rotates, so node sets are disjoint);
// ("overlap") each node takes the global top-k, so node sets overlap and the union dedups.
class TestCompressor : public Compressor {
 public:
  TestCompressor(const CompressorSpec& spec, Primitives* prims)
      : Compressor(spec, prims), spec_(spec) {}
  Pattern pattern() const override {
    return spec_.name == "test_topk" ? Pattern::kSparseGather : Pattern::kIndexUnion;
  }

  // The selection rule, shared with the test's reference.
  static void SelectInto(const CompressorSpec& spec, Primitives* prims, double density,
                         const float* acc, size_t n, uint64_t step, std::vector<uint32_t>* idx,
                         std::vector<float>* val) {
    size_t begin = 0, end = n;
    if (spec.name == "test_partition") {
      const size_t p = (step + spec.node_rank) % spec.node_count;
      begin = n * p / spec.node_count;
      end = n * (p + 1) / spec.node_count;
    }
    const size_t k = std::max<size_t>(1, static_cast<size_t>(density * n));
    idx->resize(std::min(k, end - begin));
    val->resize(idx->size());
    prims->TopK(acc + begin, end - begin, idx->size(), idx->data(), val->data());
    for (auto& i : *idx) i += static_cast<uint32_t>(begin);
  }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    if (add != nullptr) prims_->Accumulate(acc, add, ctx.n);
    SelectInto(spec_, prims_, ctx.density, acc, ctx.n, ctx.step, &out->idx, &out->val);
    if (zero) return prims_->ZeroAt(acc, ctx.n, out->idx.data(), out->idx.size());
    return absl::OkStatus();
  }

 private:
  const CompressorSpec spec_;
};

CompressorFactory TestCompressors() {
  return FactoryOf([](const CompressorSpec& spec, Primitives* p) {
    return std::make_unique<TestCompressor>(spec, p);
  });
}

// Engines with the test compressors, every bucket sparse.
EngineClusterOptions SparseCluster(int nodes, int trainers, EngineOptions base = {}) {
  EngineClusterOptions o;
  o.nodes = nodes;
  o.trainers = trainers;
  o.engine = base;
  o.engine.shm_tag = "sparsetest";
  o.engine.min_sparse_elements = 0;
  o.engine.compressor_factory = TestCompressors();
  return o;
}

// Integers: sums exact in any order (tests/support/synthetic_gradient.h).
float Value(int node, int trainer, uint64_t step, size_t i) {
  return IntegerGradient({node, trainer, 0, step, i});
}

struct Run {
  int nodes, trainers;
  std::string codec;
  size_t n = 5000;
  double density = 0.01;
  int steps = 5;
};

void ExpectExactSemantics(const Run& run) {
  SCOPED_TRACE(run.codec + " on " + std::to_string(run.nodes) + " nodes");
  auto prims = MakeReferencePrimitives();
  EngineOptions base;
  base.dense_fallback = DenseFallback::kOff;
  base.residual_norm_every = 1;
  EngineCluster cluster(SparseCluster(run.nodes, run.trainers, base));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  // Reference state: every node's residual.
  const int N = run.nodes, L = run.trainers;
  std::vector<std::vector<float>> residual(N, std::vector<float>(run.n, 0.0f));
  std::vector<std::vector<float>> expected(run.steps, std::vector<float>(run.n, 0.0f));
  std::vector<std::vector<std::vector<float>>> expected_residual(run.steps, residual);
  for (int s = 0; s < run.steps; ++s) {
    std::vector<std::vector<float>> acc = residual;
    std::vector<std::vector<uint32_t>> sel(N);
    for (int r = 0; r < N; ++r) {
      for (int t = 0; t < L; ++t)
        for (size_t i = 0; i < run.n; ++i) acc[r][i] += Value(r, t, s, i);
      CompressorSpec spec{run.codec, run.density, {}, r, N, run.n};
      std::vector<float> val;
      TestCompressor::SelectInto(spec, prims.get(), run.density, acc[r].data(), run.n, s, &sel[r],
                                 &val);
    }
    if (run.codec == "test_topk") {
      for (int r = 0; r < N; ++r) {
        for (uint32_t i : sel[r]) {
          expected[s][i] += acc[r][i] / (N * L);
          residual[r][i] = 0;
        }
        for (size_t i = 0; i < run.n; ++i) {
          if (!std::binary_search(sel[r].begin(), sel[r].end(), static_cast<uint32_t>(i)))
            residual[r][i] = acc[r][i];
        }
      }
    } else {
      std::vector<bool> in_union(run.n, false);
      for (int r = 0; r < N; ++r)
        for (uint32_t i : sel[r]) in_union[i] = true;
      for (size_t i = 0; i < run.n; ++i) {
        float sum = 0;
        for (int r = 0; r < N; ++r) sum += acc[r][i];
        if (in_union[i]) expected[s][i] = sum / (N * L);
        for (int r = 0; r < N; ++r) residual[r][i] = in_union[i] ? 0.0f : acc[r][i];
      }
    }
    expected_residual[s] = residual;
  }
  std::atomic<int> wrong{0}, norm_wrong{0};
  cluster.ForEachTrainer([&](int r, int t) {
    auto tr = Trainer::Open(&cluster.engine(r), t, L);
    ASSERT_TRUE(tr.ok()) << tr.status();
    auto g = tr->Register(1, run.n, run.codec, run.density);
    ASSERT_TRUE(g.ok()) << g.status();
    const float* out = tr->output(1);
    for (int s = 0; s < run.steps; ++s) {
      tr->Fill(1, [&](size_t i) { return Value(r, t, s, i); });
      auto rec = tr->Exchange(1, s);
      ASSERT_TRUE(rec.ok()) << rec.status();
      EXPECT_EQ(rec->pattern, run.codec == "test_topk" ? "B" : "A");
      for (size_t i = 0; i < run.n; ++i) wrong += out[i] != expected[s][i];
      if (t == 0) {
        double sq = 0;
        for (float x : expected_residual[s][r]) sq += static_cast<double>(x) * x;
        norm_wrong += std::abs(rec->residual_norm - std::sqrt(sq)) > 1e-6 * (1 + std::sqrt(sq));
      }
    }
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(norm_wrong.load(), 0) << "residual norms differ from the reference residual";
}

TEST(SparseEngineTest, PatternBIsTheSumOfEveryNodesSelection) {
  for (int nodes : {2, 4}) ExpectExactSemantics({nodes, 2, "test_topk"});
}

TEST(SparseEngineTest, PatternAIsTheExactAverageOverTheDisjointUnion) {
  for (int nodes : {2, 4}) ExpectExactSemantics({nodes, 2, "test_partition"});
}

TEST(SparseEngineTest, PatternAIsTheExactAverageOverAnOverlappingUnion) {
  for (int nodes : {2, 4}) ExpectExactSemantics({nodes, 2, "test_overlap"});
}

// Runs `steps` exchanges of one bucket with one trainer per node and returns every node's
// record per step; `between(step)` runs on node 0's thread before each step.
std::vector<std::vector<ExchangeRecord>> RunSteps(
    EngineCluster& cluster, const std::string& codec, size_t n, double density, int steps,
    std::function<void(int)> between,
    std::function<std::map<std::string, std::string>(int)> params = nullptr) {
  const int N = cluster.nodes();
  std::vector<std::vector<ExchangeRecord>> recs(N, std::vector<ExchangeRecord>(steps));
  cluster.ForEachNode([&](int r) {
    auto t = Trainer::Open(&cluster.engine(r), 0, 1);
    ASSERT_TRUE(t.ok());
    auto g = t->Register(2, n, codec, density,
                         params ? params(r) : std::map<std::string, std::string>{});
    ASSERT_TRUE(g.ok()) << g.status();
    for (int s = 0; s < steps; ++s) {
      if (r == 0 && between) between(s);
      t->Fill(2, [&](size_t i) { return Value(r, 0, s, i); });
      auto rec = t->Exchange(2, s);
      ASSERT_TRUE(rec.ok()) << rec.status();
      recs[r][s] = *rec;
    }
  });
  return recs;
}

TEST(SparseEngineTest, ADensityChangeOnOneNodeTakesEffectAtTheSameStepEverywhere) {
  EngineOptions o;
  o.dense_fallback = DenseFallback::kOff;
  EngineCluster c(SparseCluster(3, 1, o));
  ASSERT_TRUE(c.status().ok()) << c.status();
  auto recs = RunSteps(c, "test_topk", 10000, 0.01, 6, [&](int step) {
    if (step == 3) {
      EXPECT_TRUE(c.engine(0).SetDensity(0.002).ok());
    }
  });
  EXPECT_FALSE(c.engine(0).SetDensity(0).ok());
  EXPECT_FALSE(c.engine(0).SetDensity(1.5).ok());
  for (int r = 0; r < 3; ++r) {
    for (int s = 0; s < 6; ++s) {
      // Node 0 changed it before its step 3; its control all-reduce carries it to all nodes.
      const double want = s < 3 ? 0.01 : 0.002;
      EXPECT_NEAR(recs[r][s].target_density, want, 1e-6) << "node " << r << " step " << s;
      EXPECT_EQ(recs[r][s].selected_elements, static_cast<uint64_t>(want * 10000 + 0.5))
          << "node " << r;
    }
  }
}

TEST(SparseEngineTest, AutoFallbackProbesBothThenAllNodesKeepTheSameChoice) {
  EngineOptions o;
  o.dense_fallback = DenseFallback::kAuto;
  o.probe_steps = 2;
  EngineCluster c(SparseCluster(2, 1, o));
  ASSERT_TRUE(c.status().ok()) << c.status();
  auto recs = RunSteps(c, "test_topk", 50000, 0.01, 8, nullptr);
  for (int r = 0; r < 2; ++r) {
    // Probe window: sparse, dense, sparse, dense.
    EXPECT_EQ(recs[r][0].pattern, "B");
    EXPECT_EQ(recs[r][1].pattern, "D");
    EXPECT_TRUE(recs[r][1].fell_back_to_dense);
    EXPECT_EQ(recs[r][2].pattern, "B");
    EXPECT_EQ(recs[r][3].pattern, "D");
    for (int s = 5; s < 8; ++s)
      EXPECT_EQ(recs[r][s].pattern, recs[0][4].pattern) << "decision must stick";
  }
  for (int s = 4; s < 8; ++s)
    EXPECT_EQ(recs[0][s].pattern, recs[1][s].pattern) << "nodes disagree at step " << s;
}

// The bucket parameter dense_fallback=off overrides --dense_fallback=auto for that bucket: no
// probe, every step sparse. Registered on one node only, the control round refuses the first
// step on both nodes, naming the parameter.
TEST(SparseEngineTest, PerBucketDenseFallbackOff) {
  EngineOptions o;
  o.dense_fallback = DenseFallback::kAuto;
  o.probe_steps = 2;
  {
    EngineCluster c(SparseCluster(2, 1, o));
    ASSERT_TRUE(c.status().ok()) << c.status();
    auto recs = RunSteps(c, "test_topk", 50000, 0.01, 5, nullptr, [](int) {
      return std::map<std::string, std::string>{{"dense_fallback", "off"}};
    });
    for (int r = 0; r < 2; ++r) {
      for (int s = 0; s < 5; ++s) {
        EXPECT_EQ(recs[r][s].pattern, "B") << "node " << r << " step " << s;
        EXPECT_FALSE(recs[r][s].fell_back_to_dense);
      }
    }
  }
  EngineCluster c(SparseCluster(2, 1, o));
  ASSERT_TRUE(c.status().ok()) << c.status();
  std::vector<absl::Status> results(2);
  c.ForEachNode([&](int r) {
    auto t = Trainer::Open(&c.engine(r), 0, 1);
    ASSERT_TRUE(t.ok());
    std::map<std::string, std::string> params;
    if (r == 0) params["dense_fallback"] = "off";
    ASSERT_TRUE(t->Register(2, 5000, "test_topk", 0.01, params).ok());
    t->Fill(2, [](size_t i) { return static_cast<float>(i % 7); });
    results[r] = t->Exchange(2, 0).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
    EXPECT_NE(results[r].message().find("dense_fallback"), std::string::npos) << results[r];
  }
  // A bad value is refused (at registration), naming what is accepted.
  std::map<std::string, std::string> cparams;
  BucketPolicy policy;
  absl::Status bad = SplitBucketParams(o, {{"dense_fallback", "sometimes"}}, &cparams, &policy);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("accepted values auto, off"), std::string::npos) << bad;
  ASSERT_TRUE(
      SplitBucketParams(o, {{"dense_fallback", "off"}, {"x", "1"}}, &cparams, &policy).ok());
  EXPECT_EQ(policy.dense_fallback, DenseFallback::kOff);
  EXPECT_EQ(cparams.size(), 1u);  // the rest goes to the compressor
}

// A node whose AllGatherV contribution is tampered with, as a bad peer would send it.
class TamperingCollective : public ForwardingCollective {
 public:
  TamperingCollective(std::unique_ptr<Collective> inner,
                      std::function<void(std::vector<uint8_t>*)> tamper)
      : ForwardingCollective(std::move(inner)), tamper_(std::move(tamper)) {}
  const char* name() const override { return "tampering"; }
  absl::Status AllGatherV(const void* send, size_t bytes, std::vector<size_t>* counts,
                          std::vector<uint8_t>* recv) override {
    std::vector<uint8_t> mine(static_cast<const uint8_t*>(send),
                              static_cast<const uint8_t*>(send) + bytes);
    tamper_(&mine);
    return inner()->AllGatherV(mine.data(), mine.size(), counts, recv);
  }

 private:
  std::function<void(std::vector<uint8_t>*)> tamper_;
};

void ExpectPeerRejected(const std::string& codec, std::function<void(std::vector<uint8_t>*)> tamper,
                        const std::string& message) {
  EngineOptions base;
  base.dense_fallback = DenseFallback::kOff;
  EngineClusterOptions o = SparseCluster(2, 1, base);
  o.wrap = [&](int r, std::unique_ptr<Collective> c) -> std::unique_ptr<Collective> {
    if (r != 1) return c;
    return std::make_unique<TamperingCollective>(std::move(c), tamper);
  };
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<absl::Status> results(2);
  cluster.ForEachNode([&](int r) {
    auto t = Trainer::Open(&cluster.engine(r), 0, 1);
    ASSERT_TRUE(t.ok());
    auto g = t->Register(4, 1000, codec, 0.05);
    ASSERT_TRUE(g.ok()) << g.status();
    t->Fill(4, [](size_t i) { return static_cast<float>(i); });
    results[r] = t->Exchange(4, 0).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kDataLoss) << results[r];
    EXPECT_NE(results[r].message().find("node 1"), std::string::npos) << results[r];
    EXPECT_NE(results[r].message().find(message), std::string::npos) << results[r];
  }
}

TEST(SparseEngineTest, APeerCountLargerThanTheBucketIsRejected) {
  for (const char* codec : {"test_topk", "test_partition"}) {
    ExpectPeerRejected(
        codec,
        [](std::vector<uint8_t>* chunk) {
          uint32_t big = 5000;                       // the bucket has 1000 elements
          std::memcpy(chunk->data() + 24, &big, 4);  // ChunkHeader::count
        },
        "count 5000");
  }
}

TEST(SparseEngineTest, AMalformedPeerChunkIsRejected) {
  ExpectPeerRejected(
      "test_topk", [](std::vector<uint8_t>* chunk) { chunk->resize(chunk->size() - 3); }, "bytes");
  ExpectPeerRejected(
      "test_topk",
      [](std::vector<uint8_t>* chunk) {
        // Re-encoded with uint32 indices (receivers take either form, daemon/engine/wire.h),
        // the first index just outside the bucket.
        ChunkHeader h;
        std::memcpy(&h, chunk->data(), sizeof(h));
        auto d = DecodeChunk(chunk->data(), chunk->size(), h.group_id, h.step, h.elements, 1);
        ASSERT_TRUE(d.ok()) << d.status();
        std::vector<uint32_t> idx(d->idx, d->idx + h.count);
        idx[0] = 1000;
        chunk->clear();
        EncodeChunk(h.group_id, h.step, h.elements, idx, d->values, /*fp16=*/false, h.scalars,
                    chunk, IndexEncoding::kU32);
      },
      "index 1000");
  ExpectPeerRejected(
      "test_partition", [](std::vector<uint8_t>* chunk) { (*chunk)[0] ^= 0xff; }, "malformed");
}

// The fixture's failure hook: a library compressor failing Select on node 1 at step 1 fails
// that step on both nodes (the cause on node 1), after a good step 0.
TEST(SparseEngineTest, AFailingCompressorOnOneNodeFailsTheStepOnEveryNode) {
  EngineClusterOptions o;
  o.nodes = 2;
  o.engine.shm_tag = "sparsetest";
  o.engine.min_sparse_elements = 0;
  o.engine.dense_fallback = DenseFallback::kOff;
  FailingCompressor::Plan plan;
  plan.node = 1;
  plan.step = 1;
  plan.status = absl::InternalError("injected select failure");
  o.engine.compressor_factory = FailingCompressor::Factory(plan);
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<std::vector<absl::Status>> results(2, std::vector<absl::Status>(2));
  cluster.ForEachNode([&](int r) {
    auto t = Trainer::Open(&cluster.engine(r), 0, 1);
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(t->Register(3, 5000, "topk", 0.01).ok());
    for (int s = 0; s < 2; ++s) {
      t->Fill(3, [&](size_t i) { return Value(r, 0, s, i); });
      results[r][s] = t->Exchange(3, s).status();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(results[r][0].ok()) << results[r][0];
    EXPECT_FALSE(results[r][1].ok()) << "node " << r;
  }
  EXPECT_NE(results[1][1].message().find("injected select failure"), std::string::npos)
      << results[1][1];
}

}  // namespace
}  // namespace spex::test
