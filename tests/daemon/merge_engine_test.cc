// --merger inside the engine (issue 14; in-process nodes, tests/support/engine_cluster.h): for
// every merger (fixed, omgs, rgmerge) and compressor (dense: D, topk: B, micro: A), several
// trainers per node hand over several buckets on the doorbell path, DDP-like (mark every bucket
// ready, then wait for all), in five skewed orders; every trainer's output at every step equals
// the output of --merger=none bit for bit (dyadic inputs, exactly summable), and so does every
// node's residual norm (so residuals equal too); every node ran the same group sequence
// (recorded by an observer) and no schedule deadlocks (a deadlock fails WaitPublished's
// deadline). And nodes with different --merger are refused with FAILED_PRECONDITION naming it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/engine_options.h"
#include "daemon/engine/observer.h"
#include "daemon/observe/metrics.h"
#include "gtest/gtest.h"
#include "tests/support/engine_cluster.h"

namespace spex::test {
namespace {

constexpr int kBuckets = 6;
constexpr size_t kSizes[kBuckets] = {3001, 517, 4099, 64, 2048, 1500};

// Dyadic, small: every sum of them is exact in fp32 whatever the order.
float Value(int node, int trainer, int step, int bucket, size_t i) {
  const uint64_t x =
      (i * 2654435761u) ^ (node * 40503u) ^ (trainer * 9973u) ^ (step * 7919u) ^ (bucket * 104729u);
  return static_cast<float>(static_cast<int>(x % 33) - 16) * 0.125f;
}

// The order in which trainer t of node r marks its buckets ready, per schedule.
std::vector<int> Order(int schedule, int node, int trainer, int step) {
  std::vector<int> o(kBuckets);
  for (int b = 0; b < kBuckets; ++b) o[b] = b;
  switch (schedule) {
    case 0:  // backprop order everywhere
      break;
    case 1:  // reversed everywhere
      std::reverse(o.begin(), o.end());
      break;
    case 2:  // node 1 reversed, the others in order
      if (node == 1) std::reverse(o.begin(), o.end());
      break;
    case 3:  // one trainer of node 0 reversed
      if (node == 0 && trainer == 1) std::reverse(o.begin(), o.end());
      break;
    case 4:  // a rotation that differs per node, trainer and step
      std::rotate(o.begin(), o.begin() + (node * 3 + trainer + step) % kBuckets, o.end());
      break;
  }
  return o;
}

struct GroupLog : ExchangeObserver {
  struct Rec {
    uint64_t id, step;
    double norm;
    int size;
  };
  absl::Mutex mu;
  std::vector<std::string> seq;  // "bucket@step:first+size" per bucket exchange, in order
  std::vector<Rec> records;
  void OnExchange(const ExchangeEvent& e) override {
    absl::MutexLock lock(&mu);
    seq.push_back(absl::StrCat(e.record->bucket_id, "@", e.record->step, ":", e.group_first, "+",
                               e.group_size));
    records.push_back({e.record->bucket_id, e.record->step, e.record->residual_norm,
                       static_cast<int>(e.group_size)});
  }
};

struct RunResult {
  std::vector<std::vector<float>> out;  // [((step * N + node) * L + trainer) * kBuckets + b]
  std::vector<double> residual;         // [(step * N + node) * kBuckets + b], trainer 0's view
  std::vector<std::vector<std::string>> groups;  // per node
  std::vector<std::string> errors;
  int max_group = 0;
};

RunResult RunCluster(MergerPolicy merger, const std::string& compressor, int N, int L, int steps,
                     int schedule, MergerPolicy node1_merger = MergerPolicy::kNone,
                     bool differ = false, ExchangeObserver* node0_observer = nullptr) {
  EngineClusterOptions o;
  o.nodes = N;
  o.trainers = L;
  o.cpu_primitives = true;
  o.engine.shm_tag = "mergetest";
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  o.engine.residual_norm_every = 1;
  o.engine.compressor = compressor;
  o.engine.merger = merger;
  o.engine.merge.fixed_cycle_ms = 1;
  o.engine.merge.fixed_threshold_bytes = 4 * 6000;
  o.engine.merge.omgs_threshold_elements = 5000;
  std::vector<GroupLog> logs(N);
  o.node_options = [&](int r, EngineOptions* e) {
    e->observers = {&logs[r]};
    if (r == 0 && node0_observer != nullptr) e->observers.push_back(node0_observer);
    if (differ && r == 1) e->merger = node1_merger;
  };
  RunResult run;
  run.out.assign(steps * N * L * kBuckets, {});
  run.residual.assign(steps * N * kBuckets, -1);
  run.errors.assign(N * L, "");
  EngineCluster cluster(o);
  if (!cluster.status().ok()) {
    run.errors[0] = cluster.status().ToString();
    return run;
  }
  cluster.ForEachTrainer([&](int r, int t) {
    std::string& err = run.errors[r * L + t];
    auto tr = Trainer::Open(&cluster.engine(r), t, L);
    if (!tr.ok()) return void(err = tr.status().ToString());
    for (int b = 0; b < kBuckets; ++b) {
      auto g = tr->Register(b, kSizes[b], compressor, 0.05);
      if (!g.ok()) return void(err = g.status().ToString());
    }
    for (int s = 0; s < steps && err.empty(); ++s) {
      for (int b : Order(schedule, r, t, s)) {
        // Skew: node N-1's trainers are late on every bucket in schedule 2.
        if (schedule == 2 && r == N - 1) absl::SleepFor(absl::Milliseconds(2));
        tr->Fill(b, [&](size_t i) { return Value(r, t, s, b, i); });
        tr->MarkReady(b, s);
      }
      for (int b = 0; b < kBuckets; ++b) {
        if (absl::Status st = tr->WaitPublished(b, s, absl::Seconds(20)); !st.ok()) {
          // Every bucket's step is waited for (a trainer that leaves early would leave its
          // peers in a collective until the hub's timeout).
          if (err.empty()) err = absl::StrCat("bucket ", b, " step ", s, ": ", st.ToString());
          continue;
        }
        const float* out = tr->output(b);
        run.out[((s * N + r) * L + t) * kBuckets + b].assign(out, out + kSizes[b]);
      }
    }
  });
  cluster.Stop();  // the engines' last observer calls come after their last publish
  for (int r = 0; r < N; ++r) {
    absl::MutexLock lock(&logs[r].mu);
    run.groups.push_back(logs[r].seq);
    for (const auto& [id, step, norm, size] : logs[r].records) {
      if (step < static_cast<uint64_t>(steps)) run.residual[(step * N + r) * kBuckets + id] = norm;
      run.max_group = std::max(run.max_group, size);
    }
  }
  return run;
}

struct Case {
  MergerPolicy merger;
  std::string compressor;
  int nodes;
  int trainers;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return absl::StrCat(AbslUnparseFlag(info.param.merger), "_", info.param.compressor, "_",
                      info.param.nodes, "x", info.param.trainers);
}

class MergeEngineTest : public ::testing::TestWithParam<Case> {};

TEST_P(MergeEngineTest, SameAsUnmergedUnderEverySchedule) {
  const Case& c = GetParam();
  const int N = c.nodes, L = c.trainers, steps = 4;
  const RunResult want = RunCluster(MergerPolicy::kNone, c.compressor, N, L, steps, 0);
  for (int i = 0; i < N * L; ++i) ASSERT_EQ(want.errors[i], "") << "none, trainer " << i;
  int fused = 0;
  for (int schedule = 0; schedule < 5; ++schedule) {
    SCOPED_TRACE(absl::StrCat("schedule ", schedule));
    const RunResult got = RunCluster(c.merger, c.compressor, N, L, steps, schedule);
    for (int i = 0; i < N * L; ++i) ASSERT_EQ(got.errors[i], "") << "trainer " << i;
    for (size_t j = 0; j < want.out.size(); ++j) {
      ASSERT_EQ(got.out[j].size(), want.out[j].size()) << j;
      ASSERT_EQ(
          std::memcmp(got.out[j].data(), want.out[j].data(), want.out[j].size() * sizeof(float)), 0)
          << "output " << j << " (step, node, trainer, bucket) differs from --merger=none";
    }
    for (size_t j = 0; j < want.residual.size(); ++j) {
      EXPECT_EQ(got.residual[j], want.residual[j]) << "residual norm " << j;
    }
    for (int r = 1; r < N; ++r) {
      EXPECT_EQ(got.groups[r], got.groups[0]) << "node " << r << "'s group sequence";
    }
    ASSERT_EQ(got.groups[0].size(), static_cast<size_t>(steps * kBuckets));
    fused = std::max(fused, got.max_group);
  }
  // Some group held more than one bucket (else nothing was merged).
  EXPECT_GT(fused, 1);
}

INSTANTIATE_TEST_SUITE_P(Mergers, MergeEngineTest,
                         ::testing::Values(Case{MergerPolicy::kRgmerge, "dense", 2, 2},
                                           Case{MergerPolicy::kRgmerge, "topk", 3, 2},
                                           Case{MergerPolicy::kRgmerge, "micro", 2, 3},
                                           Case{MergerPolicy::kFixed, "dense", 3, 2},
                                           Case{MergerPolicy::kFixed, "topk", 2, 2},
                                           Case{MergerPolicy::kFixed, "micro", 2, 2},
                                           Case{MergerPolicy::kOmgs, "dense", 2, 2},
                                           Case{MergerPolicy::kOmgs, "topk", 4, 2},
                                           Case{MergerPolicy::kOmgs, "micro", 2, 2}),
                         CaseName);

// spexd's metrics count one exchange per merge group (spex_merge_groups_total), not per member:
// node 0's counter equals the groups its observer saw.
TEST(MergeEngineMetrics, OneExchangeCountedPerGroup) {
  for (MergerPolicy merger : {MergerPolicy::kOmgs, MergerPolicy::kRgmerge, MergerPolicy::kNone}) {
    SCOPED_TRACE(AbslUnparseFlag(merger));
    Metrics metrics(/*node_rank=*/0);
    const RunResult run =
        RunCluster(merger, "topk", 2, 1, 3, 0, MergerPolicy::kNone, false, &metrics);
    for (const std::string& e : run.errors) ASSERT_EQ(e, "");
    int groups = 0;
    for (const std::string& e : run.groups[0]) {  // "bucket@step:first+size"
      const std::string id = e.substr(0, e.find('@'));
      const std::string first = e.substr(e.find(':') + 1, e.find('+') - e.find(':') - 1);
      groups += e.substr(e.find('+') + 1) == "1" || id == first;
    }
    if (merger == MergerPolicy::kOmgs) EXPECT_LT(groups, static_cast<int>(run.groups[0].size()));
    const std::string text = metrics.Render();
    const std::string name = "spex_merge_groups_total{node=\"0\"} ";
    const size_t at = text.find(name);
    ASSERT_NE(at, std::string::npos) << text;
    EXPECT_EQ(std::stod(text.substr(at + name.size())), groups);
  }
}

TEST(MergeEngineMismatch, DifferentMergersAreRefusedNamingTheMerger) {
  for (MergerPolicy other : {MergerPolicy::kFixed, MergerPolicy::kOmgs}) {
    const RunResult got = RunCluster(MergerPolicy::kRgmerge, "dense", 2, 1, 1, 0, other, true);
    // Node 0 runs the group round (rgmerge) against node 1's (fixed: same round, other name;
    // omgs: a static plan). Every trainer's first step fails, naming the merger.
    for (int i = 0; i < 2; ++i) {
      // The doorbell path's WaitPublished names the published code: 9 = FAILED_PRECONDITION.
      EXPECT_NE(got.errors[i].find("published error status 9"), std::string::npos)
          << AbslUnparseFlag(other) << " trainer " << i << ": " << got.errors[i];
    }
  }
}

// --nonfinite=error under a merger: a NaN from one trainer of one node in bucket 2 at step 1
// skips that step on every node. rgmerge (agreed): bucket 2 alone (the offer stops before it, and
// it heads a later group alone); omgs (static plan): its whole plan group. Every other bucket
// and step completes, and the step after goes on.
TEST(MergeEngineNonfinite, ErrorPolicySkipsTheBucketOrItsPlanGroupOnEveryNode) {
  for (MergerPolicy merger : {MergerPolicy::kRgmerge, MergerPolicy::kOmgs}) {
    SCOPED_TRACE(AbslUnparseFlag(merger));
    const int N = 2, L = 2, steps = 3;
    EngineClusterOptions o;
    o.nodes = N;
    o.trainers = L;
    o.cpu_primitives = true;
    o.engine.shm_tag = "mergetest";
    o.engine.dense_fallback = DenseFallback::kOff;
    o.engine.min_sparse_elements = 0;
    o.engine.compressor = "topk";
    o.engine.merger = merger;
    o.engine.nonfinite = NonfinitePolicy::kError;
    o.engine.merge.omgs_threshold_elements = 5000;  // plan groups {0,1,2}, {3,4,5}
    EngineCluster cluster(o);
    ASSERT_TRUE(cluster.status().ok()) << cluster.status();
    std::vector<std::string> failed(N * L);  // "bucket@step " per failure
    std::vector<std::string> errors(N * L);
    cluster.ForEachTrainer([&](int r, int t) {
      auto tr = Trainer::Open(&cluster.engine(r), t, L);
      if (!tr.ok()) return void(errors[r * L + t] = tr.status().ToString());
      for (int b = 0; b < kBuckets; ++b) {
        auto g = tr->Register(b, kSizes[b], "topk", 0.05);
        if (!g.ok()) return void(errors[r * L + t] = g.status().ToString());
      }
      for (int s = 0; s < steps; ++s) {
        for (int b = 0; b < kBuckets; ++b) {
          tr->Fill(b, [&](size_t i) {
            if (r == 1 && t == 0 && b == 2 && s == 1 && i == 7) return std::nanf("");
            return Value(r, t, s, b, i);
          });
          tr->MarkReady(b, s);
        }
        for (int b = 0; b < kBuckets; ++b) {
          absl::Status st = tr->WaitPublished(b, s, absl::Seconds(20));
          if (st.ok()) continue;
          if (st.message().find("status 3") == std::string::npos) {
            errors[r * L + t] = st.ToString();
            return;
          }
          absl::StrAppend(&failed[r * L + t], b, "@", s, " ");
        }
      }
    });
    const std::string want = merger == MergerPolicy::kRgmerge ? "2@1 " : "0@1 1@1 2@1 ";
    for (int i = 0; i < N * L; ++i) {
      EXPECT_EQ(errors[i], "") << "trainer " << i;
      EXPECT_EQ(failed[i], want) << "trainer " << i;
    }
  }
}

struct SlowLog : ExchangeObserver {
  absl::Mutex mu;
  std::vector<SlowGroupEvent> events;
  void OnExchange(const ExchangeEvent&) override {}
  void OnSlowGroup(const SlowGroupEvent& e) override {
    absl::MutexLock lock(&mu);
    events.push_back(e);
  }
};

// The trainer pattern a static plan deadlocks: a trainer that waits for bucket 0's result before
// it writes bucket 1, under omgs with plan group {0,1,2}. The group waits; once it has waited
// slow_group_warning (100 ms here, 10 s by default) the engine warns once, naming the group's
// head, step and the missing buckets; bucket 0's result never comes until the trainer writes
// the others, and then every bucket completes.
TEST(MergeEngineSlowGroup, AStaticGroupWaitingForAMemberIsReportedOnce) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.trainers = 1;
  o.cpu_primitives = true;
  o.engine.shm_tag = "mergetest";
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  o.engine.compressor = "dense";
  o.engine.merger = MergerPolicy::kOmgs;
  o.engine.merge.omgs_threshold_elements = 5000;  // plan groups {0,1,2}, {3,4,5}
  o.engine.slow_group_warning = absl::Milliseconds(100);
  SlowLog log;
  o.node_options = [&](int, EngineOptions* e) { e->observers = {&log}; };
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::string error;
  absl::Status first_wait;
  cluster.ForEachTrainer([&](int r, int t) {
    auto tr = Trainer::Open(&cluster.engine(r), t, 1);
    if (!tr.ok()) return void(error = tr.status().ToString());
    for (int b = 0; b < kBuckets; ++b) {
      auto g = tr->Register(b, kSizes[b], "dense", 0);
      if (!g.ok()) return void(error = g.status().ToString());
    }
    tr->Fill(0, [&](size_t i) { return Value(r, t, 0, 0, i); });
    tr->MarkReady(0, 0);
    first_wait = tr->WaitPublished(0, 0, absl::Milliseconds(600));  // the deadlocking pattern
    for (int b = 1; b < kBuckets; ++b) {
      tr->Fill(b, [&](size_t i) { return Value(r, t, 0, b, i); });
      tr->MarkReady(b, 0);
    }
    for (int b = 0; b < kBuckets; ++b) {
      if (absl::Status st = tr->WaitPublished(b, 0, absl::Seconds(20)); !st.ok()) {
        return void(error = absl::StrCat("bucket ", b, ": ", st.ToString()));
      }
      const float* out = tr->output(b);
      for (size_t i = 0; i < kSizes[b]; ++i) {
        if (out[i] != Value(r, t, 0, b, i)) {
          return void(error = absl::StrCat("bucket ", b, " element ", i, ": ", out[i]));
        }
      }
    }
  });
  cluster.Stop();
  EXPECT_EQ(error, "");
  EXPECT_FALSE(first_wait.ok()) << "bucket 0 was published before its plan group was complete";
  absl::MutexLock lock(&log.mu);
  ASSERT_EQ(log.events.size(), 1u);
  EXPECT_EQ(log.events[0].head, 0u);
  EXPECT_EQ(log.events[0].step, 0u);
  EXPECT_GE(log.events[0].waited_ns, 100u * 1000 * 1000);
  EXPECT_EQ(log.events[0].missing, (std::vector<uint64_t>{1, 2}));
}

}  // namespace
}  // namespace spex::test
