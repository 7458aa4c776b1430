// The non-finite gradient policy (issue 16 item 3). The control round's nonfinite word tells
// every node which trainer of which node handed in the first NaN/+-Inf, so that all nodes decide
// alike before anything is mutated; and the engine's policy (--nonfinite) over 2 in-process nodes
// x 2 trainers, for dense, micro (pattern A) and topk (pattern B) buckets, with a NaN and a +Inf
// on one trainer of one node: under propagate every trainer's output is non-finite and the step
// succeeds, under error every trainer gets INVALID_ARGUMENT naming the trainer and the first bad
// index; then the clean steps must equal, bit for bit, those of a run that never saw the bad
// step (its compressor told the same step numbers), so the residual and the compressor's state
// were left exactly as before it.
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/control_round.h"
#include "daemon/engine/engine.h"
#include "daemon/transport/inproc_collective.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/synthetic_gradient.h"

namespace spex {
namespace {

TEST(NonfiniteWordTest, NamesTrainerNodeAndIndex) {
  EXPECT_EQ(NonfiniteName(NonfiniteWord(3, 1, 4000000000u)),
            "local trainer 1 of node 3, first non-finite value at index 4000000000");
  EXPECT_NE(NonfiniteWord(0, 0, 0), 0u);  // node 0, trainer 0, index 0 is still "seen"
}

// The errors the words become, exactly as trainers read them (one wording for the per-bucket
// path and merge groups).
TEST(NonfiniteWordTest, ErrorsSayWhatHappenedAndWhatToDo) {
  const absl::Status skipped = NonfiniteSkipError(4, 9, NonfiniteWord(1, 0, 12), " in its group");
  EXPECT_EQ(skipped.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(skipped.message(),
            "bucket 4 step 9: non-finite gradient from local trainer 0 of node 1, first "
            "non-finite value at index 12 in its group (nonfinite=error: this step is skipped on "
            "every node, the residual and the compressor's state are as before it, and the next "
            "step can go on)");
  const absl::Status dead = DeadTrainerError("bucket 2 step 3", DeadTrainerWord(1, 0, 77));
  EXPECT_EQ(dead.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(dead.message(),
            "bucket 2 step 3: local trainer 0 (pid 77) of node 1 died, so this step cannot "
            "complete; end the job (spexd takes a new one once the other trainers of that node "
            "have left)");
  const absl::Status broken = DeadTrainerError("g", DeadTrainerWord(0, 1 | kBrokenRank, 5));
  EXPECT_EQ(broken.message(),
            "g: local trainer 1 (pid 5) of node 0 broke the shared-segment protocol (its ready "
            "word went back below the step being exchanged: a trainer of that node wrote into a "
            "bucket's header), so this step cannot complete; end the job (spexd takes a new one "
            "once the other trainers of that node have left)");
}

// Three in-process nodes; node 1 saw a NaN at index 7 from its trainer 2, node 2 one at index 5
// from its trainer 0, node 0 none: every node gets the same word (the highest node's).
TEST(NonfiniteWordTest, EveryNodeGetsTheSameWord) {
  constexpr int kNodes = 3;
  InProcessHub hub(kNodes);
  std::vector<Control> got(kNodes);
  std::vector<absl::Status> status(kNodes);
  std::vector<std::thread> threads;
  for (int r = 0; r < kNodes; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Collective> coll = hub.Connect(r);
      const ExchangeKey key{1, 2, 100, "micro"};
      got[r].nonfinite = r == 1 ? NonfiniteWord(1, 2, 7) : r == 2 ? NonfiniteWord(2, 0, 5) : 0;
      status[r] = RunControlRound(coll.get(), key, &got[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kNodes; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(got[r].nonfinite, NonfiniteWord(2, 0, 5)) << "node " << r;
  }
}

TEST(NonfiniteWordTest, NamesAnOverflowedSum) {
  EXPECT_EQ(NonfiniteName(NonfiniteWord(1, kNonfiniteSum, 5)),
            "the sum of node 1's local inputs (each finite there) overflowed at index 5");
}

// Nodes that would decide differently on a non-finite step refuse to start one.
TEST(NonfiniteWordTest, NodesWithDifferentPoliciesGetAClearError) {
  constexpr int kNodes = 2;
  InProcessHub hub(kNodes);
  std::vector<absl::Status> status(kNodes);
  std::vector<std::thread> threads;
  for (int r = 0; r < kNodes; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Collective> coll = hub.Connect(r);
      Control c;
      status[r] = RunControlRound(
          coll.get(), ExchangeKey{1, 2, 100, "micro", r == 0 ? "propagate" : "error"}, &c);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kNodes; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kFailedPrecondition) << status[r];
    EXPECT_NE(status[r].message().find("--nonfinite"), std::string::npos) << status[r];
  }
}

TEST(NonfiniteWordTest, ZeroWhenNoNodeSawOne) {
  constexpr int kNodes = 2;
  InProcessHub hub(kNodes);
  std::vector<Control> got(kNodes);
  std::vector<std::thread> threads;
  for (int r = 0; r < kNodes; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Collective> coll = hub.Connect(r);
      EXPECT_TRUE(RunControlRound(coll.get(), ExchangeKey{1, 2, 100, "dense"}, &got[r]).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Control& c : got) EXPECT_EQ(c.nonfinite, 0u);
}

// --- The engine's policy ---

constexpr int kNodes = 2, kTrainers = 2;
constexpr size_t kElements = 20000;
constexpr uint64_t kBadStep = 2;
constexpr int kSteps = 6;            // run A: steps 0..5, step 2 bad
constexpr int kBadNode = 1;          // the node whose trainers hand in the bad values:
constexpr size_t kFirstBad = 777;    // trainer 1 here (the first bad index of the node's sum) ...
constexpr size_t kLaterBad = 12345;  // ... and trainer 0 here

// Uniform, a spike every 97th position (tests/support/synthetic_gradient.h).
float Value(int node, int trainer, uint64_t step, size_t i) {
  return test::Gradient({node, trainer, 0, step, i}, {test::GradientShape::kUniform, 1e-3});
}

// A library compressor told step + 1 for every step from `from` on: the run that never saw the
// bad step then gives its compressor the same step numbers as the run that skipped it (micro's
// partition ownership follows the step). shift 0: the library compressor as it is.
class StepShiftCompressor : public Compressor {
 public:
  StepShiftCompressor(const CompressorSpec& spec, Primitives* prims,
                      std::unique_ptr<Compressor> inner, uint64_t from, uint64_t shift)
      : Compressor(spec, prims), inner_(std::move(inner)), from_(from), shift_(shift) {}
  Pattern pattern() const override { return inner_->pattern(); }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    if (inner_->density() != ctx.density) {
      if (absl::Status s = inner_->SetDensity(ctx.density); !s.ok()) return s;
    }
    return inner_->Select(Shifted(ctx.step), acc, add, zero, out);
  }
  absl::Status DoUpdate(const StepContext& ctx, const Gathered& g) override {
    return inner_->Update(Shifted(ctx.step), g);
  }

 private:
  uint64_t Shifted(uint64_t step) const { return step >= from_ ? step + shift_ : step; }
  std::unique_ptr<Compressor> inner_;
  uint64_t from_, shift_;
};

struct PolicyCase {
  const char* compressor;
  bool nan;  // else +Inf
  NonfinitePolicy policy;
};

std::string PolicyCaseName(const testing::TestParamInfo<PolicyCase>& info) {
  return absl::StrCat(info.param.compressor, info.param.nan ? "_nan_" : "_inf_",
                      AbslUnparseFlag(info.param.policy));
}

// What one run gave: per node, trainer and step, the status, the output and the residual norm.
struct RunResult {
  std::vector<absl::Status> status;
  std::vector<std::vector<float>> output;
  std::vector<double> residual_norm;
  static size_t At(int node, int trainer, int step) {
    return (static_cast<size_t>(node) * kTrainers + trainer) * kSteps + step;
  }
};

// Run A (`skip_bad` false): steps 0..kSteps-1 with the bad values in step kBadStep. Run B
// (`skip_bad` true): the same inputs without step kBadStep, so kSteps - 1 steps, its
// compressor told step + 1 from kBadStep on.
RunResult Exchange(const PolicyCase& c, bool skip_bad, float bad) {
  test::EngineClusterOptions o;
  o.nodes = kNodes;
  o.trainers = kTrainers;
  o.cpu_primitives = true;  // the fused CPU check
  o.engine.shm_tag = skip_bad ? "nonfiniteB" : "nonfiniteA";
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  o.engine.residual_norm_every = 1;
  o.engine.nonfinite = c.policy;
  o.engine.compressor_factory = [skip_bad](
                                    const CompressorSpec& spec,
                                    Primitives* p) -> absl::StatusOr<std::unique_ptr<Compressor>> {
    absl::StatusOr<std::unique_ptr<Compressor>> inner = MakeCompressor(spec, p);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<Compressor>(
        new StepShiftCompressor(spec, p, std::move(*inner), kBadStep, skip_bad ? 1 : 0));
  };
  test::EngineCluster cluster(o);
  EXPECT_TRUE(cluster.status().ok()) << cluster.status();
  RunResult run;
  const size_t slots = static_cast<size_t>(kNodes) * kTrainers * kSteps;
  run.status.assign(slots, absl::UnknownError("not run"));
  run.output.assign(slots, {});
  run.residual_norm.assign(slots, -1);
  const int steps = skip_bad ? kSteps - 1 : kSteps;
  cluster.ForEachTrainer([&](int node, int t) {
    auto tr = test::Trainer::Open(&cluster.engine(node), t, kTrainers);
    ASSERT_TRUE(tr.ok()) << tr.status();
    ASSERT_TRUE(tr->Register(7, kElements, c.compressor, 0.01).ok());
    for (int k = 0; k < steps; ++k) {
      const uint64_t input_step = skip_bad && k >= static_cast<int>(kBadStep) ? k + 1 : k;
      tr->Fill(7, [&](size_t i) { return Value(node, t, input_step, i); });
      if (!skip_bad && input_step == kBadStep && node == kBadNode) {
        tr->input(7)[t == 1 ? kFirstBad : kLaterBad] = bad;
      }
      absl::StatusOr<ExchangeRecord> rec = tr->Exchange(7, k, absl::Seconds(20));
      const size_t at = RunResult::At(node, t, k);
      run.status[at] = rec.status();
      run.output[at].assign(tr->output(7), tr->output(7) + kElements);
      if (rec.ok()) run.residual_norm[at] = rec->residual_norm;
    }
  });
  return run;
}

class NonfinitePolicyTest : public testing::TestWithParam<PolicyCase> {};

TEST_P(NonfinitePolicyTest, BadStepThenCleanStepsAsIfItNeverHappened) {
  const PolicyCase& c = GetParam();
  const float bad =
      c.nan ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  const bool dense = std::string(c.compressor) == "dense";
  const RunResult a = Exchange(c, /*skip_bad=*/false, bad);
  const RunResult b = Exchange(c, /*skip_bad=*/true, bad);
  const std::string name = NonfiniteName(NonfiniteWord(kBadNode, 1, kFirstBad));
  for (int node = 0; node < kNodes; ++node) {
    for (int t = 0; t < kTrainers; ++t) {
      for (int s = 0; s < kSteps; ++s) {
        SCOPED_TRACE(absl::StrCat("node ", node, " trainer ", t, " step ", s));
        const size_t at = RunResult::At(node, t, s);
        const std::vector<float>& out = a.output[at];
        if (s == static_cast<int>(kBadStep)) {
          if (c.policy == NonfinitePolicy::kError) {
            EXPECT_EQ(a.status[at].code(), absl::StatusCode::kInvalidArgument) << a.status[at];
            EXPECT_NE(a.status[at].message().find(name), std::string::npos) << a.status[at];
            continue;
          }
          ASSERT_TRUE(a.status[at].ok()) << a.status[at];
          if (dense) {  // the all-reduce's NaN/Inf where an input had one, finite elsewhere
            size_t nonfinite = 0;
            for (float x : out) nonfinite += !std::isfinite(x);
            EXPECT_EQ(nonfinite, 2u);
            for (size_t i : {kFirstBad, kLaterBad}) {
              EXPECT_TRUE(c.nan ? std::isnan(out[i]) : out[i] == bad) << i << ": " << out[i];
            }
          } else {  // NaN across the bucket
            size_t nan = 0;
            for (float x : out) nan += std::isnan(x);
            EXPECT_EQ(nan, kElements);
          }
          continue;
        }
        ASSERT_TRUE(a.status[at].ok()) << a.status[at];
        // Run B's step for this one: the same inputs, one step earlier after the bad one.
        const size_t bt = RunResult::At(node, t, s > static_cast<int>(kBadStep) ? s - 1 : s);
        ASSERT_TRUE(b.status[bt].ok()) << b.status[bt];
        EXPECT_EQ(std::memcmp(out.data(), b.output[bt].data(), kElements * sizeof(float)), 0)
            << "output differs from the run that never saw the bad step";
        EXPECT_EQ(a.residual_norm[at], b.residual_norm[bt]);
        size_t nonfinite = 0;
        for (float x : out) nonfinite += !std::isfinite(x);
        EXPECT_EQ(nonfinite, 0u);
      }
    }
  }
}

std::vector<PolicyCase> PolicyCases() {
  std::vector<PolicyCase> cases;
  for (const char* compressor : {"dense", "micro", "topk"}) {
    for (bool nan : {true, false}) {
      for (NonfinitePolicy p : {NonfinitePolicy::kPropagate, NonfinitePolicy::kError}) {
        cases.push_back({compressor, nan, p});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(DenseMicroTopk, NonfinitePolicyTest, testing::ValuesIn(PolicyCases()),
                         PolicyCaseName);

// Finite inputs whose sum overflows on one node: no trainer to name, the node's sum is named.
TEST(NonfinitePolicyErrors, AnOverflowingSumIsNamedAsSuch) {
  test::EngineClusterOptions o;
  o.nodes = kNodes;
  o.trainers = kTrainers;
  o.cpu_primitives = true;
  o.engine.shm_tag = "nonfiniteO";
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  o.engine.nonfinite = NonfinitePolicy::kError;
  test::EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<absl::Status> status(kNodes * kTrainers);
  cluster.ForEachTrainer([&](int node, int t) {
    auto tr = test::Trainer::Open(&cluster.engine(node), t, kTrainers);
    ASSERT_TRUE(tr.ok()) << tr.status();
    ASSERT_TRUE(tr->Register(3, kElements, "topk", 0.01).ok());
    tr->Fill(3, [&](size_t i) { return node == 0 && i == 5 ? 3e38f : 1.0f; });
    status[node * kTrainers + t] = tr->Exchange(3, 0, absl::Seconds(20)).status();
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("the sum of node 0's local inputs (each finite there) overflowed "
                               "at index 5"),
              std::string::npos)
        << s;
  }
}

// --- Per bucket: RegisterBucket's nonfinite parameter overrides the daemon's --nonfinite ---

test::EngineClusterOptions PerBucketOptions(NonfinitePolicy daemon, const char* tag) {
  test::EngineClusterOptions o;
  o.nodes = kNodes;
  o.trainers = kTrainers;
  o.cpu_primitives = true;
  o.engine.shm_tag = tag;
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  o.engine.nonfinite = daemon;
  return o;
}

// Two buckets of one job, one with the daemon's policy and one with the other, both handed a NaN
// by trainer 1 of node 1 at step 0: each follows its own policy; step 1 (clean) works for both.
TEST(NonfinitePerBucket, EachBucketFollowsItsOwnPolicy) {
  for (NonfinitePolicy daemon : {NonfinitePolicy::kPropagate, NonfinitePolicy::kError}) {
    const NonfinitePolicy other = daemon == NonfinitePolicy::kPropagate
                                      ? NonfinitePolicy::kError
                                      : NonfinitePolicy::kPropagate;
    SCOPED_TRACE(absl::StrCat("--nonfinite=", AbslUnparseFlag(daemon)));
    test::EngineCluster cluster(PerBucketOptions(daemon, "nonfiniteP"));
    ASSERT_TRUE(cluster.status().ok()) << cluster.status();
    // [node][trainer][bucket 0 = default, 1 = override][step]
    absl::Status status[kNodes][kTrainers][2][2];
    size_t nan[kNodes][kTrainers][2][2] = {};
    cluster.ForEachTrainer([&](int node, int t) {
      auto tr = test::Trainer::Open(&cluster.engine(node), t, kTrainers);
      ASSERT_TRUE(tr.ok()) << tr.status();
      ASSERT_TRUE(tr->Register(10, kElements, "topk", 0.01).ok());
      auto grant =
          tr->Register(11, kElements, "topk", 0.01, {{"nonfinite", AbslUnparseFlag(other)}});
      ASSERT_TRUE(grant.ok()) << grant.status();
      for (int step = 0; step < 2; ++step) {
        for (int k = 0; k < 2; ++k) {
          const uint64_t id = 10 + k;
          tr->Fill(id, [&](size_t i) { return Value(node, t, step, i); });
          if (step == 0 && node == kBadNode && t == 1) {
            tr->input(id)[kFirstBad] = std::numeric_limits<float>::quiet_NaN();
          }
          status[node][t][k][step] = tr->Exchange(id, step, absl::Seconds(20)).status();
          for (size_t i = 0; i < kElements; ++i)
            nan[node][t][k][step] += std::isnan(tr->output(id)[i]);
        }
      }
    });
    const std::string name = NonfiniteName(NonfiniteWord(kBadNode, 1, kFirstBad));
    for (int node = 0; node < kNodes; ++node) {
      for (int t = 0; t < kTrainers; ++t) {
        for (int k = 0; k < 2; ++k) {
          SCOPED_TRACE(absl::StrCat("node ", node, " trainer ", t, " bucket ", 10 + k));
          const NonfinitePolicy p = k == 0 ? daemon : other;
          const absl::Status& bad = status[node][t][k][0];
          if (p == NonfinitePolicy::kError) {
            EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
            EXPECT_NE(bad.message().find(name), std::string::npos) << bad;
          } else {
            EXPECT_TRUE(bad.ok()) << bad;
            EXPECT_EQ(nan[node][t][k][0], kElements);  // NaN across a sparse bucket
          }
          EXPECT_TRUE(status[node][t][k][1].ok()) << status[node][t][k][1];
          EXPECT_EQ(nan[node][t][k][1], 0u);
        }
      }
    }
  }
}

TEST(NonfinitePerBucket, AnUnknownValueIsRefusedNamingTheAcceptedOnes) {
  test::EngineClusterOptions o = PerBucketOptions(NonfinitePolicy::kPropagate, "nonfiniteV");
  o.nodes = 1;
  o.trainers = 1;
  test::EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto tr = test::Trainer::Open(&cluster.engine(0), 0, 1);
  ASSERT_TRUE(tr.ok()) << tr.status();
  auto grant = tr->Register(1, 100, "topk", 0.01, {{"nonfinite", "ignore"}});
  ASSERT_EQ(grant.status().code(), absl::StatusCode::kInvalidArgument) << grant.status();
  EXPECT_NE(grant.status().message().find("nonfinite='ignore': accepted values propagate, error"),
            std::string::npos)
      << grant.status();
  // The parameter is the engine's: the compressor never sees it, on a dense bucket too.
  EXPECT_TRUE(tr->Register(2, 100, "dense", 0, {{"nonfinite", "error"}}).ok());
  EXPECT_TRUE(tr->Register(3, 100, "micro", 0.01, {{"nonfinite", "propagate"}}).ok());
}

TEST(NonfinitePerBucket, TrainersOfOneNodeMustAgree) {
  test::EngineClusterOptions o = PerBucketOptions(NonfinitePolicy::kPropagate, "nonfiniteT");
  o.nodes = 1;
  test::EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto t0 = test::Trainer::Open(&cluster.engine(0), 0, kTrainers);
  auto t1 = test::Trainer::Open(&cluster.engine(0), 1, kTrainers);
  ASSERT_TRUE(t0.ok() && t1.ok());
  ASSERT_TRUE(t0->Register(5, 100, "topk", 0.01, {{"nonfinite", "error"}}).ok());
  auto grant = t1->Register(5, 100, "topk", 0.01, {{"nonfinite", "propagate"}});
  ASSERT_EQ(grant.status().code(), absl::StatusCode::kInvalidArgument) << grant.status();
  EXPECT_NE(grant.status().message().find("nonfinite=error sparse_allreduce=allgather "
                                          "dense_fallback=off there, nonfinite=propagate "
                                          "sparse_allreduce=allgather dense_fallback=off here"),
            std::string::npos)
      << grant.status();
}

// Node 0 registers the bucket with nonfinite=error, node 1 keeps the daemon's propagate: the
// control round refuses the step on both nodes, naming the bucket, before any collective.
TEST(NonfinitePerBucket, NodesMustAgree) {
  test::EngineCluster cluster(PerBucketOptions(NonfinitePolicy::kPropagate, "nonfiniteN"));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<absl::Status> status(kNodes * kTrainers);
  cluster.ForEachTrainer([&](int node, int t) {
    auto tr = test::Trainer::Open(&cluster.engine(node), t, kTrainers);
    ASSERT_TRUE(tr.ok()) << tr.status();
    std::map<std::string, std::string> params;
    if (node == 0) params["nonfinite"] = "error";
    ASSERT_TRUE(tr->Register(6, 1000, "topk", 0.01, params).ok());
    tr->Fill(6, [&](size_t i) { return Value(node, t, 0, i); });
    status[node * kTrainers + t] = tr->Exchange(6, 0, absl::Seconds(20)).status();
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("bucket 6 runs nonfinite="), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace spex
