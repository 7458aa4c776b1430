// The sparse exchange inside the engine, over the in-process collective (N nodes as threads,
// L trainers per node), with test codecs of both wire patterns. Every trainer's result must
// equal a reference computed from all inputs with the pattern's semantics, and the residual
// must carry exactly what was not sent:
//   A (index union): out[i] = sum over nodes of acc_node[i] / (N L) on the union, 0 elsewhere;
//                    every node's residual is zeroed on the whole union.
//   B (sparse gather): out = sum over nodes of acc_node restricted to its selection / (N L);
//                    each node's residual is zeroed on its own selection.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "daemon/engine/engine.h"
#include "daemon/memory/futex.h"
#include "daemon/transport/inproc_collective.h"
#include "gtest/gtest.h"
#include "kernels/reference/reference_primitives.h"

namespace spex {
namespace {

// Pattern B: exact top-k of the whole bucket. Pattern A ("partition"): each node takes the
// top-k of the partition it owns this step (ownership rotates, so node sets are disjoint);
// ("overlap") each node takes the global top-k, so node sets overlap and the union dedups.
class TestCodec : public Codec {
 public:
  TestCodec(std::string kind, const CodecSpec& spec, Primitives* prims)
      : kind_(std::move(kind)), spec_(spec), prims_(prims), density_(spec.density) {}
  WirePattern pattern() const override {
    return kind_ == "test_topk" ? WirePattern::kSparseGather : WirePattern::kIndexUnion;
  }
  absl::Status SetDensity(double d) override {
    density_ = d;
    return absl::OkStatus();
  }
  absl::Status Select(float* acc, size_t n, uint64_t step, bool zero,
                      CodecSelection* out) override {
    SelectInto(kind_, spec_, prims_, density_, acc, n, step, &out->idx, &out->val);
    if (zero) return prims_->ZeroAt(acc, n, out->idx.data(), out->idx.size());
    return absl::OkStatus();
  }
  absl::Status Update(uint64_t, const std::vector<uint64_t>& counts,
                      const std::vector<uint32_t>&) override {
    gathered_counts = counts;
    return absl::OkStatus();
  }

  // The selection rule, shared with the test's reference.
  static void SelectInto(const std::string& kind, const CodecSpec& spec, Primitives* prims,
                         double density, const float* acc, size_t n, uint64_t step,
                         std::vector<uint32_t>* idx, std::vector<float>* val) {
    size_t begin = 0, end = n;
    if (kind == "test_partition") {
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

  std::vector<uint64_t> gathered_counts;

 private:
  std::string kind_;
  CodecSpec spec_;
  Primitives* prims_;
  double density_;
};

float Value(int node, int trainer, uint64_t step, size_t i) {
  uint64_t x = (static_cast<uint64_t>(node) << 56) ^ (static_cast<uint64_t>(trainer) << 48) ^
               (step << 32) ^ i;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<float>(static_cast<int>((x ^ (x >> 31)) % 2001) - 1000);
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
  InProcessHub hub(run.nodes, absl::Seconds(20));
  auto prims = MakeReferencePrimitives();
  std::vector<std::unique_ptr<Collective>> colls;
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < run.nodes; ++r) {
    colls.push_back(hub.Connect(r));
    EngineOptions o;
    o.local_trainers = run.trainers;
    o.shm_tag = "sparsetest";
    o.dense_fallback = "off";
    o.min_sparse_elements = 0;
    o.residual_norm_every = 1;
    o.codec_factory = [](const CodecSpec& spec,
                         Primitives* p) -> absl::StatusOr<std::unique_ptr<Codec>> {
      return std::unique_ptr<Codec>(new TestCodec(spec.name, spec, p));
    };
    engines.push_back(std::make_unique<Engine>(o, colls.back().get(), prims.get()));
    ASSERT_TRUE(engines.back()->Start().ok());
  }
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
      CodecSpec spec{run.codec, run.density, {}, r, N, run.n};
      std::vector<float> val;
      TestCodec::SelectInto(run.codec, spec, prims.get(), run.density, acc[r].data(), run.n, s,
                            &sel[r], &val);
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
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r) {
    for (int t = 0; t < L; ++t) {
      threads.emplace_back([&, r, t] {
        Engine& e = *engines[r];
        auto hello = e.Hello("", t, L, 0, "t");
        ASSERT_TRUE(hello.ok()) << hello.status();
        auto g = e.RegisterBucket(hello->session_id, 1, run.n, run.codec, run.density);
        ASSERT_TRUE(g.ok()) << g.status();
        uint8_t* base = static_cast<uint8_t*>(const_cast<ShmBuffer*>(g->buffer)->data());
        float* in = reinterpret_cast<float*>(base + g->input_offset);
        const float* out = reinterpret_cast<const float*>(base + g->output_offset);
        for (int s = 0; s < run.steps; ++s) {
          for (size_t i = 0; i < run.n; ++i) in[i] = Value(r, t, s, i);
          auto rec = e.Exchange(hello->session_id, 1, s, absl::Now() + absl::Seconds(20));
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
    }
  }
  for (auto& th : threads) th.join();
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

// Starts `nodes` engines with test codecs and runs `steps` exchanges of one bucket with one
// trainer per node; `between(step)` runs on node 0's thread before each step.
struct MiniCluster {
  MiniCluster(int nodes, EngineOptions base)
      : hub(nodes, absl::Seconds(20)), prims(MakeReferencePrimitives()) {
    for (int r = 0; r < nodes; ++r) {
      colls.push_back(hub.Connect(r));
      EngineOptions o = base;
      o.shm_tag = "sparsetest";
      o.min_sparse_elements = 0;
      o.codec_factory = [](const CodecSpec& spec,
                           Primitives* p) -> absl::StatusOr<std::unique_ptr<Codec>> {
        return std::unique_ptr<Codec>(new TestCodec(spec.name, spec, p));
      };
      engines.push_back(std::make_unique<Engine>(o, colls.back().get(), prims.get()));
      EXPECT_TRUE(engines.back()->Start().ok());
    }
  }
  // Returns every node's record per step.
  std::vector<std::vector<ExchangeRecord>> Run(const std::string& codec, size_t n, double density,
                                               int steps, std::function<void(int)> between) {
    const int N = static_cast<int>(engines.size());
    std::vector<std::vector<ExchangeRecord>> recs(N, std::vector<ExchangeRecord>(steps));
    std::vector<std::thread> threads;
    for (int r = 0; r < N; ++r) {
      threads.emplace_back([&, r] {
        Engine& e = *engines[r];
        auto hello = e.Hello("", 0, 1, 0, "t");
        ASSERT_TRUE(hello.ok());
        auto g = e.RegisterBucket(hello->session_id, 2, n, codec, density);
        ASSERT_TRUE(g.ok()) << g.status();
        float* in = reinterpret_cast<float*>(
            static_cast<uint8_t*>(const_cast<ShmBuffer*>(g->buffer)->data()) + g->input_offset);
        for (int s = 0; s < steps; ++s) {
          if (r == 0 && between) between(s);
          for (size_t i = 0; i < n; ++i) in[i] = Value(r, 0, s, i);
          auto rec = e.Exchange(hello->session_id, 2, s, absl::Now() + absl::Seconds(20));
          ASSERT_TRUE(rec.ok()) << rec.status();
          recs[r][s] = *rec;
        }
      });
    }
    for (auto& t : threads) t.join();
    return recs;
  }
  InProcessHub hub;
  std::unique_ptr<Primitives> prims;
  std::vector<std::unique_ptr<Collective>> colls;
  std::vector<std::unique_ptr<Engine>> engines;
};

TEST(SparseEngineTest, ADensityChangeOnOneNodeTakesEffectAtTheSameStepEverywhere) {
  EngineOptions o;
  o.dense_fallback = "off";
  MiniCluster c(3, o);
  auto recs = c.Run("test_topk", 10000, 0.01, 6, [&](int step) {
    if (step == 3) EXPECT_TRUE(c.engines[0]->SetDensity(0.002).ok());
  });
  EXPECT_FALSE(c.engines[0]->SetDensity(0).ok());
  EXPECT_FALSE(c.engines[0]->SetDensity(1.5).ok());
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
  o.dense_fallback = "auto";
  o.probe_steps = 2;
  MiniCluster c(2, o);
  auto recs = c.Run("test_topk", 50000, 0.01, 8, nullptr);
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

// A node whose AllGatherV contribution is tampered with, as a bad peer would send it.
class TamperingCollective : public Collective {
 public:
  TamperingCollective(std::unique_ptr<Collective> inner,
                      std::function<void(std::vector<uint8_t>*)> tamper)
      : inner_(std::move(inner)), tamper_(std::move(tamper)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* name() const override { return "tampering"; }
  absl::Status AllReduce(void* d, size_t c, ElemType t, ReduceOp o) override {
    return inner_->AllReduce(d, c, t, o);
  }
  absl::Status AllReduceScaled(const float* s, float* r, size_t c, float k) override {
    return inner_->AllReduceScaled(s, r, c, k);
  }
  absl::Status AllGather(const void* s, size_t b, void* r) override {
    return inner_->AllGather(s, b, r);
  }
  absl::Status AllGatherV(const void* send, size_t bytes, std::vector<size_t>* counts,
                          std::vector<uint8_t>* recv) override {
    std::vector<uint8_t> mine(static_cast<const uint8_t*>(send),
                              static_cast<const uint8_t*>(send) + bytes);
    tamper_(&mine);
    return inner_->AllGatherV(mine.data(), mine.size(), counts, recv);
  }
  absl::Status Broadcast(void* d, size_t b, int root) override {
    return inner_->Broadcast(d, b, root);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }

 private:
  std::unique_ptr<Collective> inner_;
  std::function<void(std::vector<uint8_t>*)> tamper_;
};

void ExpectPeerRejected(const std::string& codec, std::function<void(std::vector<uint8_t>*)> tamper,
                        const std::string& message) {
  InProcessHub hub(2, absl::Seconds(20));
  auto prims = MakeReferencePrimitives();
  std::vector<std::unique_ptr<Collective>> colls;
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < 2; ++r) {
    colls.push_back(r == 1 ? std::make_unique<TamperingCollective>(hub.Connect(r), tamper)
                           : hub.Connect(r));
    EngineOptions o;
    o.shm_tag = "sparsetest";
    o.dense_fallback = "off";
    o.min_sparse_elements = 0;
    o.codec_factory = [](const CodecSpec& spec,
                         Primitives* p) -> absl::StatusOr<std::unique_ptr<Codec>> {
      return std::unique_ptr<Codec>(new TestCodec(spec.name, spec, p));
    };
    engines.push_back(std::make_unique<Engine>(o, colls.back().get(), prims.get()));
    ASSERT_TRUE(engines.back()->Start().ok());
  }
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto hello = engines[r]->Hello("", 0, 1, 0, "t");
      ASSERT_TRUE(hello.ok());
      auto g = engines[r]->RegisterBucket(hello->session_id, 4, 1000, codec, 0.05);
      ASSERT_TRUE(g.ok()) << g.status();
      float* in = reinterpret_cast<float*>(
          static_cast<uint8_t*>(const_cast<ShmBuffer*>(g->buffer)->data()) + g->input_offset);
      for (int i = 0; i < 1000; ++i) in[i] = static_cast<float>(i);
      results[r] =
          engines[r]->Exchange(hello->session_id, 4, 0, absl::Now() + absl::Seconds(20)).status();
    });
  }
  for (auto& t : threads) t.join();
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
        uint32_t out = 1000;  // first index, just outside the bucket
        std::memcpy(chunk->data() + 48, &out, 4);
      },
      "index 1000");
  ExpectPeerRejected(
      "test_partition", [](std::vector<uint8_t>* chunk) { (*chunk)[0] ^= 0xff; }, "malformed");
}

}  // namespace
}  // namespace spex
