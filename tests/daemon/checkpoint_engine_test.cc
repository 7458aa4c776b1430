// Checkpoint and restore through the engine (issue 29; Engine::SaveBucketState and
// LoadBucketState, in-process nodes of tests/support/engine_cluster.h): a job interrupted after
// step S, whose every node saved its buckets, and resumed on fresh engines that load them
// (their trainers count from 0 again) hands every trainer the same outputs, bit for bit, as the
// uninterrupted job for every step after S, so the parameters end identical; for dense, micro,
// exdyna, topk, dgc, sage and sidco_e, without a merger, with rgmerge and with fixed. The same
// resume without loading differs for every compressor that keeps state (all but dense). And: a
// record of another node, another compressor, or a corrupt one is refused naming what differs while
// the bucket goes on exchanging; saving in the middle of a step is refused, and so is loading
// after the bucket's first exchange. Saving does not stall the node's other exchanges while the
// record is encoded.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/engine_options.h"
#include "gtest/gtest.h"
#include "tests/support/engine_cluster.h"

namespace spex::test {
namespace {

constexpr int kN = 2;  // nodes
constexpr int kL = 2;  // local trainers per node
constexpr int kBuckets = 3;
constexpr size_t kSizes[kBuckets] = {3001, 517, 2048};
constexpr int kSteps = 8;  // the whole job
constexpr int kStop = 4;   // the interrupted job saves after steps 0..kStop-1

// Dyadic, small: every sum of them is exact in fp32 whatever the order. `step` is the job's.
float Value(int node, int trainer, int step, int bucket, size_t i) {
  const uint64_t x =
      (i * 2654435761u) ^ (node * 40503u) ^ (trainer * 9973u) ^ (step * 7919u) ^ (bucket * 104729u);
  return static_cast<float>(static_cast<int>(x % 33) - 16) * 0.125f;
}

// records[node][bucket]: what node `node` saved.
using Records = std::vector<std::vector<std::string>>;

struct JobRun {
  // outputs[((job step * kN + node) * kL + trainer) * kBuckets + bucket]
  std::vector<std::vector<float>> out;
  Records saved;
  std::vector<std::string> errors;
};

EngineClusterOptions Options(const std::string& compressor, MergerPolicy merger) {
  EngineClusterOptions o;
  o.nodes = kN;
  o.trainers = kL;
  o.cpu_primitives = true;
  o.engine.shm_tag = "ckpttest";
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  o.engine.compressor = compressor;
  o.engine.merger = merger;
  o.engine.merge.fixed_cycle_ms = 1;
  return o;
}

// Job steps [first, last) on a fresh cluster (trainer steps 0, 1, ...). With `load`, local
// trainer 0 of every node loads its node's records after registering; with `save`, it saves
// every bucket after the last step.
JobRun RunJob(const std::string& compressor, MergerPolicy merger, int first, int last,
              const Records* load, bool save) {
  JobRun run;
  run.out.assign(kSteps * kN * kL * kBuckets, {});
  run.saved.assign(kN, std::vector<std::string>(kBuckets));
  run.errors.assign(kN * kL, "");
  EngineCluster cluster(Options(compressor, merger));
  if (!cluster.status().ok()) {
    run.errors[0] = cluster.status().ToString();
    return run;
  }
  cluster.ForEachTrainer([&](int r, int t) {
    std::string& err = run.errors[r * kL + t];
    auto tr = Trainer::Open(&cluster.engine(r), t, kL);
    if (!tr.ok()) return void(err = tr.status().ToString());
    for (int b = 0; b < kBuckets; ++b) {
      auto g = tr->Register(b, kSizes[b], compressor, 0.05);
      if (!g.ok()) return void(err = g.status().ToString());
      if (load != nullptr && t == 0) {
        absl::Status s = cluster.engine(r).LoadBucketState(tr->session_id(), b, (*load)[r][b]);
        if (!s.ok()) return void(err = absl::StrCat("load bucket ", b, ": ", s.ToString()));
      }
    }
    for (int s = 0; s + first < last && err.empty(); ++s) {
      for (int b = 0; b < kBuckets; ++b) {
        tr->Fill(b, [&](size_t i) { return Value(r, t, s + first, b, i); });
        tr->MarkReady(b, s);
      }
      for (int b = 0; b < kBuckets; ++b) {
        if (absl::Status st = tr->WaitPublished(b, s); !st.ok()) {
          if (err.empty()) err = absl::StrCat("bucket ", b, " step ", s, ": ", st.ToString());
          continue;
        }
        const float* out = tr->output(b);
        run.out[(((s + first) * kN + r) * kL + t) * kBuckets + b].assign(out, out + kSizes[b]);
      }
    }
    if (save && t == 0 && err.empty()) {
      for (int b = 0; b < kBuckets; ++b) {
        auto rec = cluster.engine(r).SaveBucketState(tr->session_id(), b);
        if (!rec.ok())
          return void(err = absl::StrCat("save bucket ", b, ": ", rec.status().ToString()));
        run.saved[r][b] = *rec;
      }
    }
  });
  return run;
}

void ExpectNoErrors(const JobRun& run, const std::string& what) {
  for (size_t i = 0; i < run.errors.size(); ++i) {
    EXPECT_EQ(run.errors[i], "") << what << " node " << i / kL << " trainer " << i % kL;
  }
}

// Every trainer's output of job steps [first, last) in `a` equals `b`'s bit for bit (so SGD's
// parameters, updated from them alike, end bit-identical); else *where says where first not.
bool SameOutputs(const JobRun& a, const JobRun& b, int first, int last, std::string* where) {
  for (int s = first; s < last; ++s) {
    for (int j = 0; j < kN * kL * kBuckets; ++j) {
      const auto& x = a.out[s * kN * kL * kBuckets + j];
      const auto& y = b.out[s * kN * kL * kBuckets + j];
      if (x.size() != y.size() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0) {
        *where = absl::StrCat("step ", s, " node ", j / (kL * kBuckets), " trainer ",
                              (j / kBuckets) % kL, " bucket ", j % kBuckets);
        return false;
      }
    }
  }
  return true;
}

struct Case {
  std::string compressor;
  MergerPolicy merger;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.compressor << " merger " << AbslUnparseFlag(c.merger);
}

class ResumeTest : public ::testing::TestWithParam<Case> {};

TEST_P(ResumeTest, ResumedJobIsBitIdenticalAndTheUnrestoredOneIsNot) {
  const Case& c = GetParam();
  const JobRun whole = RunJob(c.compressor, c.merger, 0, kSteps, nullptr, false);
  ExpectNoErrors(whole, "uninterrupted");
  const JobRun before = RunJob(c.compressor, c.merger, 0, kStop, nullptr, true);
  ExpectNoErrors(before, "before the stop");
  const JobRun resumed = RunJob(c.compressor, c.merger, kStop, kSteps, &before.saved, false);
  ExpectNoErrors(resumed, "resumed");
  std::string where;
  EXPECT_TRUE(SameOutputs(before, whole, 0, kStop, &where)) << "before the stop, " << where;
  EXPECT_TRUE(SameOutputs(resumed, whole, kStop, kSteps, &where))
      << c.compressor << ": the resumed job differs from the uninterrupted one at " << where;
  const JobRun fresh = RunJob(c.compressor, c.merger, kStop, kSteps, nullptr, false);
  ExpectNoErrors(fresh, "resumed without loading");
  if (c.compressor == "dense") {
    // A dense bucket keeps nothing between steps: its record holds no residual or state.
    EXPECT_TRUE(SameOutputs(fresh, whole, kStop, kSteps, &where)) << where;
  } else {
    EXPECT_FALSE(SameOutputs(fresh, whole, kStop, kSteps, &where))
        << c.compressor << ": resuming without the checkpoint should differ";
  }
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (MergerPolicy m : {MergerPolicy::kNone, MergerPolicy::kRgmerge, MergerPolicy::kFixed}) {
    for (const char* name : {"dense", "micro", "exdyna", "topk", "dgc", "sage", "sidco_e"}) {
      out.push_back({name, m});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Compressors, ResumeTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.compressor, "_",
                                               AbslUnparseFlag(info.param.merger));
                         });

// One node's refusals while its bucket keeps exchanging: a record of node 1 loaded on node 0,
// another compressor's, a corrupt and a truncated one; saving after handing in a step.
TEST(CheckpointEngine, RefusalsNameWhatDiffersAndTheBucketGoesOn) {
  const JobRun before = RunJob("micro", MergerPolicy::kNone, 0, 2, nullptr, true);
  ExpectNoErrors(before, "before");
  std::string corrupt = before.saved[0][0];
  corrupt[corrupt.size() / 2] ^= 0x10;
  const std::string truncated = before.saved[0][0].substr(0, before.saved[0][0].size() - 9);
  EngineCluster cluster(Options("micro", MergerPolicy::kNone));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<std::string> errors(kN * kL);
  // Step 1's other trainers hand in only after each node's trainer 0 tried its save: an exchange
  // that completed first would have moved the bucket on to trainer 0's next step (a save between
  // steps, rightly allowed), and the test raced it on a loaded machine.
  std::atomic<int> saves_tried{0};
  absl::Notification all_saves_tried;
  cluster.ForEachTrainer([&](int r, int t) {
    std::string& err = errors[r * kL + t];
    auto tr = Trainer::Open(&cluster.engine(r), t, kL);
    if (!tr.ok()) return void(err = tr.status().ToString());
    auto g = tr->Register(0, kSizes[0], "micro", 0.05);
    auto g1 = tr->Register(1, kSizes[1], "topk", 0.05);
    if (!g.ok() || !g1.ok()) return void(err = "register");
    Engine& e = cluster.engine(r);
    if (t == 0 && r == 0) {
      absl::Status s = e.LoadBucketState(tr->session_id(), 0, before.saved[1][0]);
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_NE(s.message().find("saved by node 1 of 2"), std::string::npos) << s;
      EXPECT_NE(s.message().find("this daemon is node 0 of 2"), std::string::npos) << s;
      s = e.LoadBucketState(tr->session_id(), 1, before.saved[0][1]);  // micro into topk
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_NE(s.message().find("used compressor micro (none), this bucket uses topk"),
                std::string::npos)
          << s;
      s = e.LoadBucketState(tr->session_id(), 0, corrupt);
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      EXPECT_NE(s.message().find("corrupt or truncated"), std::string::npos) << s;
      s = e.LoadBucketState(tr->session_id(), 0, truncated);
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      s = e.LoadBucketState(tr->session_id(), 0, "");
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      s = e.LoadBucketState(tr->session_id(), 7, before.saved[0][0]);
      EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    }
    for (int s = 0; s < 2; ++s) {
      if (s == 1 && t != 0 && !all_saves_tried.WaitForNotificationWithTimeout(absl::Seconds(60))) {
        err = "trainer 0 of some node never tried its save";
      }
      for (int b = 0; b < 2; ++b) {
        tr->Fill(b, [&](size_t i) { return Value(r, t, s, b, i); });
        tr->MarkReady(b, s);
      }
      if (s == 1 && t == 0) {
        // Handed in, the step not exchanged: not between steps for this trainer.
        auto rec = e.SaveBucketState(tr->session_id(), 0);
        EXPECT_EQ(rec.status().code(), absl::StatusCode::kFailedPrecondition) << rec.status();
        EXPECT_NE(rec.status().message().find("between steps only"), std::string::npos);
        if (saves_tried.fetch_add(1) + 1 == kN) all_saves_tried.Notify();
      }
      for (int b = 0; b < 2; ++b) {
        if (absl::Status st = tr->WaitPublished(b, s); !st.ok()) err = st.ToString();
      }
    }
    // After the bucket's first exchange a record is refused, even one saved at the step the
    // bucket is at (its step base would move the compressor under the trainers).
    if (t == 0 && r == 0) {
      absl::Status s = e.LoadBucketState(tr->session_id(), 0, before.saved[0][0]);
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_NE(s.message().find("has run 2 step(s) already: load a checkpoint before the "
                                 "bucket's first exchange"),
                std::string::npos)
          << s;
    }
    // The refused loads changed nothing: the bucket exchanged on and saves fine.
    if (t == 0) {
      auto rec = e.SaveBucketState(tr->session_id(), 0);
      EXPECT_TRUE(rec.ok()) << rec.status();
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

// Saving copies the bucket under the engine's mutex and encodes and seals the copy outside it:
// while a record is being encoded, another bucket of the node exchanges (with the encoding
// under the mutex, that exchange waited until the save returned).
TEST(CheckpointEngine, EncodingARecordDoesNotStallTheNode) {
  EngineClusterOptions o = Options("topk", MergerPolicy::kNone);
  o.nodes = 1;
  o.trainers = 1;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  Engine& e = cluster.engine(0);
  auto tr = Trainer::Open(&e, 0, 1);
  ASSERT_TRUE(tr.ok()) << tr.status();
  ASSERT_TRUE(tr->Register(0, kSizes[0], "topk", 0.05).ok());
  ASSERT_TRUE(tr->Register(1, kSizes[1], "topk", 0.05).ok());
  for (int b = 0; b < 2; ++b) {
    tr->Fill(b, [&](size_t i) { return Value(0, 0, 0, b, i); });
    tr->MarkReady(b, 0);
  }
  for (int b = 0; b < 2; ++b) ASSERT_TRUE(tr->WaitPublished(b, 0).ok());
  absl::Status during = absl::UnknownError("the hook did not run");
  std::vector<float> out;
  e.SetSaveCopiedHookForTest([&] {
    tr->Fill(0, [&](size_t i) { return Value(0, 0, 1, 0, i); });
    tr->MarkReady(0, 1);
    during = tr->WaitPublished(0, 1, absl::Seconds(3));
    if (during.ok()) out.assign(tr->output(0), tr->output(0) + kSizes[0]);
  });
  absl::StatusOr<std::string> rec = e.SaveBucketState(tr->session_id(), 1);
  e.SetSaveCopiedHookForTest(nullptr);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_TRUE(during.ok()) << "bucket 0's step during bucket 1's save: " << during;
  EXPECT_EQ(out.size(), kSizes[0]);
  // The record is whole and loads into a fresh bucket of a fresh node.
  o.engine.shm_tag = "ckptfresh";  // beside the first cluster's segments
  EngineCluster fresh(o);
  ASSERT_TRUE(fresh.status().ok()) << fresh.status();
  auto again = Trainer::Open(&fresh.engine(0), 0, 1);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(again->Register(1, kSizes[1], "topk", 0.05).ok());
  EXPECT_TRUE(fresh.engine(0).LoadBucketState(again->session_id(), 1, *rec).ok());
}

// Another number of local trainers per node is refused, naming both worlds.
TEST(CheckpointEngine, AnotherWorldIsRefused) {
  const JobRun before = RunJob("topk", MergerPolicy::kNone, 0, 1, nullptr, true);
  ExpectNoErrors(before, "before");
  EngineClusterOptions o = Options("topk", MergerPolicy::kNone);
  o.trainers = 1;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto tr = Trainer::Open(&cluster.engine(0), 0, 1);
  ASSERT_TRUE(tr.ok()) << tr.status();
  ASSERT_TRUE(tr->Register(0, kSizes[0], "topk", 0.05).ok());
  absl::Status s = cluster.engine(0).LoadBucketState(tr->session_id(), 0, before.saved[0][0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("with 2 local trainer(s), this daemon is node 0 of 2 with 1"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace spex::test
