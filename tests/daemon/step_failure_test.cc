// A local failure in the middle of a step never leaves the peers inside a collective: a failure
// injected on one node at each phase after the control round (local reduce, compress, between
// and after the exchange's collectives, a collective that reports a failure after its data
// moved, decode, the device-health check after the step) fails that step on EVERY trainer
// of EVERY node, promptly (no exchange timeout), with the cause on the failing node and the
// failing node's rank on the others. The bucket is then failed for good (its state is unknown):
// later steps get the same error at once; other buckets and new buckets keep working.
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/engine.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/reference/reference_primitives.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/forwarding_primitives.h"

namespace spex {
namespace {

constexpr int kFaultyNode = 1;

// What to break on node kFaultyNode, armed by the test between steps (one shot).
enum class Fault {
  kReduce,
  kSelect,
  kGatherV,
  kGather,
  kScatterAdd,
  kAllReduceFloat,
  kAllReduceScaled,
  kUpdate,
  kHealth
};
struct Injector {
  std::atomic<int> armed{-1};  // a Fault, or -1
  bool Take(Fault f) {
    int want = static_cast<int>(f);
    return armed.compare_exchange_strong(want, -1);
  }
};

absl::Status Injected(const char* where) {
  return absl::InternalError(absl::StrCat("injected failure in ", where));
}

// The reference primitives, with SumScaled and Health breakable on one node.
class FaultyPrimitives : public test::ForwardingPrimitives {
 public:
  FaultyPrimitives(Injector* inj, bool faulty)
      : ForwardingPrimitives(MakeReferencePrimitives()), inj_(inj), faulty_(faulty) {}
  absl::Status SumScaled(float* y, const float* const* xs, int count, float a, size_t n) override {
    absl::Status s = inner()->SumScaled(y, xs, count, a, n);
    if (faulty_ && inj_->Take(Fault::kReduce)) return Injected("SumScaled");
    return s;
  }
  absl::Status ScatterAdd(float* y, size_t n, const uint32_t* i, const float* v,
                          size_t m) override {
    if (faulty_ && inj_->Take(Fault::kScatterAdd)) return Injected("ScatterAdd");
    return inner()->ScatterAdd(y, n, i, v, m);
  }
  absl::Status Gather(const float* x, size_t n, const uint32_t* i, size_t m, float* out) override {
    if (faulty_ && inj_->Take(Fault::kGather)) return Injected("Gather");
    return inner()->Gather(x, n, i, m, out);
  }
  absl::Status Health() const override {
    if (faulty_ && inj_->Take(Fault::kHealth)) return Injected("device health");
    return inner()->Health();
  }

 private:
  Injector* inj_;
  bool faulty_;
};

// A collective whose AllGatherV / AllReduceScaled / float32 AllReduce complete and then report a
// local failure on one node: the data moved, the peers go on, this node fails.
class FaultyCollective : public Collective {
 public:
  FaultyCollective(std::unique_ptr<Collective> c, Injector* inj) : c_(std::move(c)), inj_(inj) {}
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  const char* name() const override { return "faulty"; }
  absl::Status AllReduce(void* d, size_t n, ElemType t, ReduceOp op) override {
    absl::Status st = c_->AllReduce(d, n, t, op);
    // float32: pattern A's union values (the votes and control rounds are integers).
    if (t == ElemType::kFloat32 && faulty() && inj_->Take(Fault::kAllReduceFloat)) {
      return Injected("AllReduce");
    }
    return st;
  }
  absl::Status AllReduceScaled(const float* s, float* r, size_t n, float scale) override {
    absl::Status st = c_->AllReduceScaled(s, r, n, scale);
    if (faulty() && inj_->Take(Fault::kAllReduceScaled)) return Injected("AllReduceScaled");
    return st;
  }
  absl::Status AllGather(const void* s, size_t b, void* r) override {
    return c_->AllGather(s, b, r);
  }
  absl::Status AllGatherV(const void* s, size_t b, std::vector<size_t>* counts,
                          std::vector<uint8_t>* r) override {
    absl::Status st = c_->AllGatherV(s, b, counts, r);
    if (faulty() && inj_->Take(Fault::kGatherV)) return Injected("AllGatherV");
    return st;
  }
  absl::Status Broadcast(void* d, size_t b, int root) override { return c_->Broadcast(d, b, root); }
  absl::Status Barrier() override { return c_->Barrier(); }

 private:
  bool faulty() const { return c_->rank() == kFaultyNode; }
  std::unique_ptr<Collective> c_;
  Injector* inj_;
};

// A library compressor whose Select / Update fail on one node when armed.
class FaultyCompressor : public Compressor {
 public:
  FaultyCompressor(const CompressorSpec& spec, Primitives* prims, Injector* inj)
      : Compressor(spec, prims), inj_(inj), faulty_(spec.node_rank == kFaultyNode) {
    inner_ = std::move(MakeCompressor(spec, prims).value());
  }
  Pattern pattern() const override { return inner_->pattern(); }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    if (faulty_ && inj_->Take(Fault::kSelect)) return Injected("Select");
    if (ctx.density != inner_->density()) {
      if (absl::Status s = inner_->SetDensity(ctx.density); !s.ok()) return s;
    }
    return inner_->Select(ctx.step, acc, add, zero, out);
  }
  absl::Status DoUpdate(const StepContext& ctx, const Gathered& g) override {
    absl::Status s = inner_->Update(ctx.step, g);
    if (faulty_ && inj_->Take(Fault::kUpdate)) return Injected("Update");
    return s;
  }

 private:
  Injector* inj_;
  bool faulty_;
  std::unique_ptr<Compressor> inner_;
};

struct Case {
  const char* name;
  Fault fault;
  const char* compressor;
  const char* cause;  // in the failing node's message
};

class StepFailureTest : public testing::TestWithParam<Case> {};

TEST_P(StepFailureTest, EveryTrainerOfEveryNodeGetsTheErrorPromptly) {
  const Case& c = GetParam();
  const int N = 2, L = 2;
  const size_t n = 20000;
  Injector inj;
  std::vector<std::unique_ptr<Primitives>> prims;
  for (int r = 0; r < N; ++r) {
    prims.push_back(std::make_unique<FaultyPrimitives>(&inj, r == kFaultyNode));
  }
  test::EngineClusterOptions o;
  o.nodes = N;
  o.trainers = L;
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  o.engine.compressor_factory = [&inj](
                                    const CompressorSpec& spec,
                                    Primitives* p) -> absl::StatusOr<std::unique_ptr<Compressor>> {
    return std::unique_ptr<Compressor>(new FaultyCompressor(spec, p, &inj));
  };
  o.parts = [&](int node) { return test::NodeParts{prims[node].get(), {}}; };
  o.wrap = [&](int, std::unique_ptr<Collective> c) -> std::unique_ptr<Collective> {
    return std::make_unique<FaultyCollective>(std::move(c), &inj);
  };
  test::EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  // results[node][trainer][step] for bucket 7 (the one that fails at step 1) and bucket 8 (a
  // healthy dense bucket exchanged after it in every step).
  const int steps = 3;
  std::vector<std::vector<std::vector<absl::Status>>> r7(
      N, std::vector<std::vector<absl::Status>>(L, std::vector<absl::Status>(steps))),
      r8 = r7;
  std::atomic<int> at_barrier{0};
  std::atomic<int> phase{0};
  std::thread driver([&] {
    for (int s = 0; s < steps; ++s) {
      while (at_barrier.load() < (s + 1) * N * L) std::this_thread::yield();
      if (s == 1) inj.armed = static_cast<int>(c.fault);
      phase = s;
    }
  });
  cluster.ForEachTrainer([&](int node, int t) {
    auto trainer = test::Trainer::Open(&cluster.engine(node), t, L);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE(trainer->Register(7, n, c.compressor, 0.01).ok());
    ASSERT_TRUE(trainer->Register(8, 1000, "dense", 0).ok());
    for (int s = 0; s < steps; ++s) {
      trainer->Fill(7, [&](size_t i) { return static_cast<float>((i * 7 + s + t) % 101) - 50; });
      // Every trainer finishes step s before the fault is armed for step 1.
      at_barrier++;
      while (phase.load() < s) std::this_thread::yield();
      const absl::Time t0 = absl::Now();
      r7[node][t][s] = trainer->Exchange(7, s, absl::Seconds(15)).status();
      EXPECT_LT(absl::Now() - t0, absl::Seconds(5)) << "node " << node << " step " << s;
      r8[node][t][s] = trainer->Exchange(8, s, absl::Seconds(15)).status();
    }
  });
  driver.join();
  EXPECT_EQ(inj.armed.load(), -1) << "the fault was never reached";
  for (int node = 0; node < N; ++node) {
    for (int t = 0; t < L; ++t) {
      SCOPED_TRACE(absl::StrCat("node ", node, " trainer ", t));
      EXPECT_TRUE(r7[node][t][0].ok()) << r7[node][t][0];
      const absl::Status& s1 = r7[node][t][1];
      ASSERT_FALSE(s1.ok());
      if (node == kFaultyNode) {
        EXPECT_NE(s1.message().find(c.cause), std::string::npos) << s1;
      } else {
        EXPECT_EQ(s1.code(), absl::StatusCode::kInternal) << s1;
        EXPECT_NE(s1.message().find("node 1 failed bucket 7 step 1"), std::string::npos) << s1;
      }
      // Terminal: the next step gets the same error, at once.
      EXPECT_EQ(r7[node][t][2], s1);
      for (int s = 0; s < steps; ++s)
        EXPECT_TRUE(r8[node][t][s].ok()) << s << ": " << r8[node][t][s];
    }
  }
  for (int node = 0; node < N; ++node) {
    for (const BucketSummary& b : cluster.engine(node).Buckets()) {
      EXPECT_EQ(b.state, b.bucket_id == 7 ? "failed" : "waiting") << b.bucket_id;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Phases, StepFailureTest,
    testing::Values(Case{"ReduceLocalDense", Fault::kReduce, "dense", "SumScaled"},
                    Case{"CompressPatternB", Fault::kSelect, "topk", "Select"},
                    Case{"CompressPatternA", Fault::kSelect, "micro", "Select"},
                    Case{"CollectivePatternB", Fault::kGatherV, "topk", "AllGatherV"},
                    Case{"BetweenCollectivesPatternA", Fault::kGather, "micro", "Gather"},
                    Case{"AfterGatherPatternB", Fault::kScatterAdd, "topk", "ScatterAdd"},
                    Case{"AfterValuesPatternA", Fault::kAllReduceFloat, "micro", "AllReduce"},
                    Case{"CollectiveDense", Fault::kAllReduceScaled, "dense", "AllReduceScaled"},
                    Case{"DecodePatternB", Fault::kUpdate, "topk", "Update"},
                    Case{"DecodePatternA", Fault::kUpdate, "micro", "Update"},
                    Case{"AfterStepDeviceHealth", Fault::kHealth, "dense", "device health"}),
    [](const testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace spex
