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
#include <functional>
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
    case 5:  // reversed everywhere; node N-1 waits for bucket 0's result first (RunCluster)
      std::reverse(o.begin(), o.end());
      break;
  }
  return o;
}

struct GroupLog : ExchangeObserver {
  struct Rec {
    uint64_t id, step;
    double norm;
    int size;
    uint64_t selected;
  };
  absl::Mutex mu;
  std::vector<std::string> seq;  // "bucket@step:first+size" per bucket exchange, in order
  std::vector<Rec> records;
  void OnExchange(const ExchangeEvent& e) override {
    absl::MutexLock lock(&mu);
    seq.push_back(absl::StrCat(e.record->bucket_id, "@", e.record->step, ":", e.group_first, "+",
                               e.group_size));
    records.push_back({e.record->bucket_id, e.record->step, e.record->residual_norm,
                       static_cast<int>(e.group_size), e.record->selected_elements});
  }
};

struct RunResult {
  std::vector<std::vector<float>> out;  // [((step * N + node) * L + trainer) * kBuckets + b]
  std::vector<double> residual;         // [(step * N + node) * kBuckets + b], trainer 0's view
  std::vector<std::vector<std::string>> groups;  // per node
  std::vector<std::string> errors;
  int max_group = 0;
  std::vector<uint64_t> reduces_reused;  // per node: Engine::reduces_reused()
};

// In-process nodes of L trainers each, the dense fallback off, every bucket sparse.
EngineClusterOptions BaseOptions(int N, int L, const std::string& compressor, const char* tag) {
  EngineClusterOptions o;
  o.nodes = N;
  o.trainers = L;
  o.cpu_primitives = true;
  o.engine.shm_tag = tag;
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  o.engine.residual_norm_every = 1;
  o.engine.compressor = compressor;
  return o;
}

RunResult RunCluster(MergerPolicy merger, const std::string& compressor, int N, int L, int steps,
                     int schedule, MergerPolicy node1_merger = MergerPolicy::kNone,
                     bool differ = false, ExchangeObserver* node0_observer = nullptr,
                     bool overlap = true, bool node1_no_overlap = false,
                     const std::function<void(EngineOptions*)>& tweak = nullptr) {
  EngineClusterOptions o = BaseOptions(N, L, compressor, "mergetest");
  o.engine.merger = merger;
  o.engine.merge.fixed_cycle_ms = 1;
  o.engine.merge.fixed_threshold_bytes = 4 * 6000;
  o.engine.merge.omgs_threshold_elements = 5000;
  o.engine.merge_overlap = overlap;
  o.engine.merge.omgs_select_behind = false;  // ahead: every output equals none's
  if (tweak) tweak(&o.engine);
  std::vector<GroupLog> logs(N);
  o.node_options = [&](int r, EngineOptions* e) {
    e->observers = {&logs[r]};
    if (r == 0 && node0_observer != nullptr) e->observers.push_back(node0_observer);
    if (differ && r == 1) e->merger = node1_merger;
    if (node1_no_overlap && r == 1) e->merge_overlap = false;
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
      if (schedule == 5 && r == N - 1) {
        // Every other node hands in all of its buckets at once (bucket 0 last, so they become
        // ready together); this one hands in bucket 0 alone and waits for its result, so the
        // first round of the step agrees on bucket 0 only while the others offered all six.
        tr->Fill(0, [&](size_t i) { return Value(r, t, s, 0, i); });
        tr->MarkReady(0, s);
        if (absl::Status st = tr->WaitPublished(0, s, absl::Seconds(20)); !st.ok()) {
          err = absl::StrCat("bucket 0 step ", s, ": ", st.ToString());
          break;
        }
      }
      for (int b : Order(schedule, r, t, s)) {
        if (schedule == 5 && r == N - 1 && b == 0) continue;  // handed in above
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
  // Every trainer has its last result, so the engines have counted every round (Stop ends them).
  for (int r = 0; r < N; ++r) run.reduces_reused.push_back(cluster.engine(r).reduces_reused());
  cluster.Stop();  // the engines' last observer calls come after their last publish
  for (int r = 0; r < N; ++r) {
    absl::MutexLock lock(&logs[r].mu);
    run.groups.push_back(logs[r].seq);
    for (const auto& [id, step, norm, size, selected] : logs[r].records) {
      if (step < static_cast<uint64_t>(steps)) run.residual[(step * N + r) * kBuckets + id] = norm;
      run.max_group = std::max(run.max_group, size);
    }
  }
  return run;
}

// Every trainer's output of `got` equals --merger=none's (`want`) bit for bit, and so does every
// node's residual norm.
void ExpectSameAsNone(const RunResult& got, const RunResult& want) {
  for (size_t j = 0; j < want.out.size(); ++j) {
    ASSERT_EQ(got.out[j].size(), want.out[j].size()) << j;
    ASSERT_EQ(
        std::memcmp(got.out[j].data(), want.out[j].data(), want.out[j].size() * sizeof(float)), 0)
        << "output " << j << " (step, node, trainer, bucket) differs from --merger=none";
  }
  for (size_t j = 0; j < want.residual.size(); ++j) {
    EXPECT_EQ(got.residual[j], want.residual[j]) << "residual norm " << j;
  }
}

struct Case {
  MergerPolicy merger;
  std::string compressor;
  int nodes;
  int trainers;
  bool overlap = true;  // --merge_overlap (the groups' collectives on the wire stage)
  bool model = false;   // rgmerge's model plan / omgs's mgs mode, agreed at step 2, from step 3
  bool linger = false;  // --rgmerge_linger=auto (alpha measured, linger_max 2 ms)
  bool late = false;    // --rgmerge_bind=late
};

// --rgmerge_plan=model with the plan agreed at `plan_step`.
std::function<void(EngineOptions*)> Model(uint64_t plan_step, int64_t slack_us = 0,
                                          int64_t alpha_us = 0) {
  return [=](EngineOptions* e) {  // rgmerge's model plan, or omgs's mgs mode
    e->merge.omgs_mode = OmgsMode::kMgs;
    e->merge.rgmerge_model = true;
    e->merge.plan_step = plan_step;
    e->merge.rgmerge_slack_us = slack_us;
    e->merge.merge_alpha_us = alpha_us;
  };
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return absl::StrCat(AbslUnparseFlag(info.param.merger), "_", info.param.compressor, "_",
                      info.param.nodes, "x", info.param.trainers,
                      info.param.overlap ? "" : "_no_overlap", info.param.model ? "_model" : "",
                      info.param.linger ? "_linger" : "", info.param.late ? "_late" : "");
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
    const RunResult got =
        RunCluster(c.merger, c.compressor, N, L, steps, schedule, MergerPolicy::kNone, false,
                   nullptr, c.overlap, false,
                   // alpha pinned at 1 s: the plans merge whatever this machine's timings
                   c.model    ? Model(2, 0, 1000000)
                   : c.linger ? std::function<void(EngineOptions*)>([](EngineOptions* e) {
                       e->merge.rgmerge_linger_auto = true;
                       e->merge.rgmerge_linger_max_us = 2000;
                     })
                   : c.late   ? std::function<void(EngineOptions*)>(
                                  [](EngineOptions* e) { e->merge.rgmerge_bind_late = true; })
                            : nullptr);
    for (int i = 0; i < N * L; ++i) ASSERT_EQ(got.errors[i], "") << "trainer " << i;
    ASSERT_NO_FATAL_FAILURE(ExpectSameAsNone(got, want));
    for (int r = 1; r < N; ++r) {
      EXPECT_EQ(got.groups[r], got.groups[0]) << "node " << r << "'s group sequence";
    }
    ASSERT_EQ(got.groups[0].size(), static_cast<size_t>(steps * kBuckets));
    fused = std::max(fused, got.max_group);
  }
  // Some group held more than one bucket (else nothing was merged).
  EXPECT_GT(fused, 1);
}

INSTANTIATE_TEST_SUITE_P(
    Mergers, MergeEngineTest,
    ::testing::Values(
        Case{MergerPolicy::kRgmerge, "dense", 2, 2}, Case{MergerPolicy::kRgmerge, "topk", 3, 2},
        Case{MergerPolicy::kRgmerge, "micro", 2, 3}, Case{MergerPolicy::kFixed, "dense", 3, 2},
        Case{MergerPolicy::kFixed, "topk", 2, 2}, Case{MergerPolicy::kFixed, "micro", 2, 2},
        Case{MergerPolicy::kOmgs, "dense", 2, 2}, Case{MergerPolicy::kOmgs, "topk", 4, 2},
        Case{MergerPolicy::kOmgs, "micro", 2, 2}, Case{MergerPolicy::kRgmerge, "topk", 2, 2, false},
        Case{MergerPolicy::kFixed, "micro", 2, 2, false},
        Case{MergerPolicy::kOmgs, "dense", 2, 2, false},
        Case{MergerPolicy::kRgmerge, "dense", 2, 2, true, true},
        Case{MergerPolicy::kRgmerge, "topk", 3, 2, true, true},
        Case{MergerPolicy::kRgmerge, "micro", 2, 2, true, true},
        Case{MergerPolicy::kOmgs, "topk", 3, 2, true, true},
        Case{MergerPolicy::kOmgs, "dense", 2, 2, true, true},
        Case{MergerPolicy::kRgmerge, "topk", 3, 2, true, false, true},
        Case{MergerPolicy::kRgmerge, "dense", 2, 2, false, false, true},
        Case{MergerPolicy::kRgmerge, "topk", 3, 2, true, false, false, true},
        Case{MergerPolicy::kRgmerge, "micro", 2, 2, true, false, false, true}),
    CaseName);

// A node whose trainers are ahead offers more members than the round agrees on; those members'
// local reduces are kept for the next round instead of being done again (ProcessGroup), and the
// results still equal --merger=none's. Schedule 5: nodes 0..N-2 offer all six buckets, node N-1
// bucket 0 alone, so every step's first round agrees on one bucket and leaves five reduced
// members on each of the other nodes, which the second round takes without reducing them again.
TEST(MergeEngineReduce, MembersLeftForALaterGroupAreNotReducedAgain) {
  const int N = 3, L = 2, steps = 4;
  for (const char* compressor : {"topk", "dense"}) {
    SCOPED_TRACE(compressor);
    const RunResult want = RunCluster(MergerPolicy::kNone, compressor, N, L, steps, 0);
    const RunResult got = RunCluster(MergerPolicy::kRgmerge, compressor, N, L, steps, 5);
    for (int i = 0; i < N * L; ++i) {
      ASSERT_EQ(want.errors[i], "") << "none, trainer " << i;
      ASSERT_EQ(got.errors[i], "") << "trainer " << i;
    }
    ASSERT_NO_FATAL_FAILURE(ExpectSameAsNone(got, want));
    for (int r = 0; r < N; ++r) {
      // Each step: [0] then [1..5]; the second round reuses the first round's five reduces on
      // the nodes that were ahead, and node N-1 never offered more than was agreed.
      EXPECT_EQ(got.groups[r], got.groups[0]) << "node " << r << "'s group sequence";
      EXPECT_EQ(got.reduces_reused[r], r == N - 1 ? 0u : 5u * steps) << "node " << r;
    }
    ASSERT_EQ(got.groups[0].size(), static_cast<size_t>(steps * kBuckets));
    for (int s = 0; s < steps; ++s) {
      EXPECT_EQ(got.groups[0][s * kBuckets], absl::StrCat("0@", s, ":0+1")) << "step " << s;
    }
  }
}

// --rgmerge_plan=model: `ready` up to the plan step, the agreed static plan from the next step on,
// the same on every node. With a slack of one second every initial group of the generator is a
// pair ([0 1] [2 3] [4 5]); with alpha fixed at 1 s (--merge_alpha_us) the long-tail step cuts
// after the first pair (comm of buckets 0-1 >= alpha > the backward gaps and selection times of
// buckets 2-5, microseconds here): the plan is [0 1] [2 3 4 5].
TEST(MergeEngineModel, ThePlanTakesEffectAfterThePlanStepOnEveryNode) {
  const int N = 3, steps = 6;
  const RunResult want = RunCluster(MergerPolicy::kNone, "dense", N, 1, steps, 0);
  const RunResult got = RunCluster(MergerPolicy::kRgmerge, "dense", N, 1, steps, 0,
                                   MergerPolicy::kNone, false, nullptr, true, false,
                                   Model(/*plan_step=*/3, /*slack_us=*/1000000,
                                         /*alpha_us=*/1000000));
  for (int i = 0; i < N; ++i) ASSERT_EQ(got.errors[i], "") << "node " << i;
  for (size_t j = 0; j < want.out.size(); ++j) {
    ASSERT_EQ(got.out[j], want.out[j]) << "output " << j << " differs from --merger=none";
  }
  for (int r = 1; r < N; ++r) EXPECT_EQ(got.groups[r], got.groups[0]) << "node " << r;
  std::vector<std::string> planned;
  for (const std::string& g : got.groups[0]) {
    const size_t at = g.find('@');
    const int step = std::stoi(g.substr(at + 1));
    if (step >= 4) planned.push_back(g.substr(0, at) + g.substr(g.find(':')));
  }
  const std::vector<std::string> plan = {"0:0+2", "1:0+2", "2:2+4", "3:2+4", "4:2+4", "5:2+4"};
  ASSERT_EQ(planned.size(), 2 * plan.size());
  for (size_t i = 0; i < planned.size(); ++i) {
    EXPECT_EQ(planned[i], plan[i % plan.size()]) << "exchange " << i << " after the plan step";
  }
}

// The reference of selection behind (docs/merging.md 2.5): --merger=none with one bucket per plan
// group, registered under the group's first id, whose input is the members' inputs back to back.
// Returns the outputs in RunCluster's layout (each member's slice of its group's output).
RunResult RunGroupsAsBuckets(const std::string& compressor, int N, int L, int steps,
                             const std::vector<std::vector<int>>& groups) {
  const EngineClusterOptions o = BaseOptions(N, L, compressor, "mergeref");
  RunResult run;
  run.out.assign(steps * N * L * kBuckets, {});
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
    for (const std::vector<int>& g : groups) {
      size_t n = 0;
      for (int b : g) n += kSizes[b];
      auto reg = tr->Register(g[0], n, compressor, 0.05);
      if (!reg.ok()) return void(err = reg.status().ToString());
    }
    for (int s = 0; s < steps && err.empty(); ++s) {
      for (const std::vector<int>& g : groups) {
        std::vector<std::pair<int, size_t>> at;  // (member, index in the member) per position
        for (int b : g) {
          for (size_t i = 0; i < kSizes[b]; ++i) at.push_back({b, i});
        }
        tr->Fill(g[0], [&](size_t j) { return Value(r, t, s, at[j].first, at[j].second); });
        tr->MarkReady(g[0], s);
      }
      for (const std::vector<int>& g : groups) {
        if (absl::Status st = tr->WaitPublished(g[0], s, absl::Seconds(20)); !st.ok()) {
          if (err.empty()) err = absl::StrCat("group ", g[0], " step ", s, ": ", st.ToString());
          continue;
        }
        const float* out = tr->output(g[0]);
        for (int b : g) {
          run.out[((s * N + r) * L + t) * kBuckets + b].assign(out, out + kSizes[b]);
          out += kSizes[b];
        }
      }
    }
  });
  cluster.Stop();
  return run;
}

// Selection behind: a static plan's group of one compressor is one bucket of the summed size.
// omgs (threshold 5000 over sizes 3001 517 4099 64 2048 1500: groups [0 1 2] [3 4 5]) and
// rgmerge's model plan with --rgmerge_select=behind (plan from step 3; up to it `ready`, so ahead,
// and the residuals carry over) give every member its slice of that bucket's output, under every
// schedule, the same on every node.
TEST(MergeEngineBehind, AGroupIsOneBucketOfTheSummedSize) {
  const int N = 2, L = 2, steps = 4;
  for (const char* compressor : {"topk", "micro"}) {
    SCOPED_TRACE(compressor);
    const RunResult want = RunGroupsAsBuckets(compressor, N, L, steps, {{0, 1, 2}, {3, 4, 5}});
    for (int i = 0; i < N * L; ++i) ASSERT_EQ(want.errors[i], "") << "reference, trainer " << i;
    for (int schedule = 0; schedule < 5; ++schedule) {
      SCOPED_TRACE(absl::StrCat("schedule ", schedule));
      const RunResult got =
          RunCluster(MergerPolicy::kOmgs, compressor, N, L, steps, schedule, MergerPolicy::kNone,
                     false, nullptr, schedule % 2 == 0, false,
                     [](EngineOptions* e) { e->merge.omgs_select_behind = true; });
      for (int i = 0; i < N * L; ++i) ASSERT_EQ(got.errors[i], "") << "trainer " << i;
      for (size_t j = 0; j < want.out.size(); ++j) {
        ASSERT_EQ(got.out[j], want.out[j]) << "output " << j << " (step, node, trainer, bucket)";
      }
      EXPECT_EQ(got.groups[1], got.groups[0]);
    }
  }
}

// A behind group (its compressor's state) belongs to its job: a second job on the same daemons,
// registering the same buckets right after the first left, computes what a fresh daemon computes
// (sidco_e fits its threshold from step to step, state a kept group would carry over: without the
// groups dropped between jobs the second job's outputs differ).
TEST(MergeEngineBehind, ANewJobStartsWithFreshGroups) {
  const int N = 2, steps = 4;
  auto job = [&](EngineCluster& cluster, std::vector<std::vector<float>>* out) {
    out->assign(steps * N * kBuckets, {});
    cluster.ForEachTrainer([&](int r, int t) {
      auto tr = Trainer::Open(&cluster.engine(r), t, 1);
      ASSERT_TRUE(tr.ok()) << tr.status();
      for (int b = 0; b < kBuckets; ++b) {
        ASSERT_TRUE(tr->Register(b, kSizes[b], "sidco_e", 0.05).ok());
      }
      for (int s = 0; s < steps; ++s) {
        for (int b = 0; b < kBuckets; ++b) {
          tr->Fill(b, [&](size_t i) { return Value(r, t, s, b, i); });
          tr->MarkReady(b, s);
        }
        for (int b = 0; b < kBuckets; ++b) {
          ASSERT_TRUE(tr->WaitPublished(b, s, absl::Seconds(20)).ok()) << b << "@" << s;
          const float* o = tr->output(b);
          (*out)[(s * N + r) * kBuckets + b].assign(o, o + kSizes[b]);
        }
      }
      EXPECT_TRUE(tr->Goodbye().ok());
    });
  };
  auto options = [](const char* tag) {
    EngineClusterOptions o = BaseOptions(N, 1, "sidco_e", tag);
    o.engine.merger = MergerPolicy::kOmgs;
    o.engine.merge.omgs_threshold_elements = 5000;
    o.engine.merge.omgs_select_behind = true;
    return o;
  };
  std::vector<std::vector<float>> first, second, fresh;
  {
    EngineCluster twice(options("mergejobs"));
    ASSERT_TRUE(twice.status().ok()) << twice.status();
    job(twice, &first);
    job(twice, &second);
  }
  EngineCluster once(options("mergejob1"));
  ASSERT_TRUE(once.status().ok()) << once.status();
  job(once, &fresh);
  ASSERT_EQ(first.size(), fresh.size());
  for (size_t j = 0; j < fresh.size(); ++j) {
    ASSERT_EQ(first[j], fresh[j]) << "first job, output " << j;
    ASSERT_EQ(second[j], fresh[j]) << "second job, output " << j << " (step, node, bucket)";
  }
}

// rgmerge's model plan with --rgmerge_select=behind: the plan of MergeEngineModel ([0 1]
// [2 3 4 5] from step 4; `ready`, so ahead, before). topk selects exactly k: behind, the group
// [2 3 4 5] (7711 elements) selects floor(0.05 * 7711) = 385 entries per node, where its members
// ahead select 204 + 3 + 102 + 75 = 384.
TEST(MergeEngineBehind, RgmergeModelSelectsBehindAfterThePlanStep) {
  const int N = 2, steps = 6;
  GroupLog log;
  const RunResult got =
      RunCluster(MergerPolicy::kRgmerge, "topk", N, 1, steps, 0, MergerPolicy::kNone, false, &log,
                 true, false, [](EngineOptions* e) {
                   Model(3, 1000000, 1000000)(e);
                   e->merge.rgmerge_select_behind = true;
                 });
  for (int i = 0; i < N; ++i) ASSERT_EQ(got.errors[i], "") << "node " << i;
  EXPECT_EQ(got.groups[1], got.groups[0]);
  std::vector<uint64_t> selected(steps, 0);
  absl::MutexLock lock(&log.mu);
  for (const auto& r : log.records) {
    if (r.id >= 2) selected[r.step] += r.selected;
  }
  for (int s = 0; s < steps; ++s) {
    EXPECT_EQ(selected[s], s >= 4 ? 385u : 384u) << "entries of buckets 2-5 at step " << s;
  }
}

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
    if (merger == MergerPolicy::kOmgs) {
      EXPECT_LT(groups, static_cast<int>(run.groups[0].size()));
    }
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

// --merge_overlap differing between nodes is refused like a differing merger flag.
TEST(MergeEngineMismatch, DifferentOverlapIsRefused) {
  const RunResult got = RunCluster(MergerPolicy::kRgmerge, "topk", 2, 1, 1, 0, MergerPolicy::kNone,
                                   false, nullptr, /*overlap=*/true, /*node1_no_overlap=*/true);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(got.errors[i].find("published error status 9"), std::string::npos)
        << "trainer " << i << ": " << got.errors[i];
  }
}

// A collective that records when its calls ran, and sleeps in the data collectives (the wire
// stage's: AllReduceScaled, AllGatherV) so that a pack stays on the wire a while.
class TimedCollective : public Collective {
 public:
  TimedCollective(std::unique_ptr<Collective> inner, absl::Duration sleep)
      : inner_(std::move(inner)), sleep_(sleep) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* name() const override { return "timed"; }
  absl::Status AllReduce(void* data, size_t count, ElemType type, ReduceOp op) override {
    Note();
    return inner_->AllReduce(data, count, type, op);
  }
  absl::Status AllReduceScaled(const float* send, float* recv, size_t count, float scale) override {
    Note();
    absl::SleepFor(sleep_);
    return inner_->AllReduceScaled(send, recv, count, scale);
  }
  absl::Status AllGather(const void* send, size_t bytes, void* recv) override {
    Note();
    return inner_->AllGather(send, bytes, recv);
  }
  absl::Status AllGatherV(const void* send, size_t send_bytes, std::vector<size_t>* counts,
                          std::vector<uint8_t>* recv) override {
    Note();
    absl::SleepFor(sleep_);
    return inner_->AllGatherV(send, send_bytes, counts, recv);
  }
  absl::Status AllToAllV(const std::vector<std::vector<uint8_t>>& send,
                         std::vector<std::vector<uint8_t>>* recv) override {
    Note();
    return inner_->AllToAllV(send, recv);
  }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    Note();
    return inner_->Broadcast(data, bytes, root);
  }
  absl::Status Barrier() override {
    Note();
    return inner_->Barrier();
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(starts_.size());
  }
  std::vector<absl::Time> starts() {
    absl::MutexLock lock(&mu_);
    return starts_;
  }

 private:
  void Note() {
    absl::MutexLock lock(&mu_);
    starts_.push_back(absl::Now());
  }
  std::unique_ptr<Collective> inner_;
  absl::Duration sleep_;
  absl::Mutex mu_;
  std::vector<absl::Time> starts_;
};

// With --merge_overlap the next group's round (a collective on the engine's own channel) starts
// while the previous group's data collective is still on the wire: some engine-channel call
// starts inside a wire call's sleep. Without it, the wire channel is never used. Results equal
// --merger=none's either way (the test above).
TEST(MergeEngineOverlap, TheNextGroupsRoundRunsWhileAGroupIsOnTheWire) {
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    const int N = 2, steps = 3;
    const absl::Duration sleep = absl::Milliseconds(40);
    EngineClusterOptions o;
    o.nodes = N;
    o.trainers = 1;
    o.cpu_primitives = true;
    o.wire_collective = false;  // set below, wrapped
    o.start = false;
    o.engine.shm_tag = "overlaptest";
    o.engine.dense_fallback = DenseFallback::kOff;
    o.engine.min_sparse_elements = 0;
    o.engine.compressor = "topk";
    o.engine.merger = MergerPolicy::kRgmerge;
    o.engine.merge.limits.max_group_elements = 4200;  // about two buckets per group
    o.engine.merge_overlap = overlap;
    std::vector<TimedCollective*> engine_side(N);
    o.wrap = [&](int r, std::unique_ptr<Collective> c) -> std::unique_ptr<Collective> {
      auto t = std::make_unique<TimedCollective>(std::move(c), absl::ZeroDuration());
      engine_side[r] = t.get();
      return t;
    };
    InProcessHub wire_hub(N);  // outlives the cluster's engines
    std::vector<std::unique_ptr<TimedCollective>> wire(N);
    for (int r = 0; r < N; ++r) {
      wire[r] = std::make_unique<TimedCollective>(wire_hub.Connect(r), sleep);
    }
    EngineCluster cluster(o);
    for (int r = 0; r < N; ++r) cluster.engine(r).set_wire_collective(wire[r].get());
    ASSERT_TRUE(cluster.Start().ok());
    std::vector<std::string> errors(N);
    cluster.ForEachTrainer([&](int r, int t) {
      std::string& err = errors[r];
      auto tr = Trainer::Open(&cluster.engine(r), t, 1);
      if (!tr.ok()) return void(err = tr.status().ToString());
      for (int b = 0; b < kBuckets; ++b) {
        auto g = tr->Register(b, kSizes[b], "topk", 0.05);
        if (!g.ok()) return void(err = g.status().ToString());
      }
      for (int s = 0; s < steps && err.empty(); ++s) {
        for (int b = 0; b < kBuckets; ++b) {
          tr->Fill(b, [&](size_t i) { return Value(r, t, s, b, i); });
          tr->MarkReady(b, s);
        }
        for (int b = 0; b < kBuckets; ++b) {
          if (absl::Status st = tr->WaitPublished(b, s, absl::Seconds(20)); !st.ok()) {
            if (err.empty()) err = absl::StrCat("bucket ", b, " step ", s, ": ", st.ToString());
          }
        }
      }
      // Leaving erases the buckets, which waits until no pack is on the wire.
      for (int b = 0; b < kBuckets && err.empty(); ++b) {
        if (absl::Status st = tr->Unregister(b); !st.ok()) err = st.ToString();
      }
    });
    cluster.Stop();
    for (int r = 0; r < N; ++r) ASSERT_EQ(errors[r], "") << "node " << r;
    if (!overlap) {
      EXPECT_EQ(wire[0]->calls(), 0);
      continue;
    }
    ASSERT_GT(wire[0]->calls(), 0);
    int inside = 0;
    for (absl::Time w : wire[0]->starts()) {
      for (absl::Time e : engine_side[0]->starts()) {
        if (e > w && e < w + sleep) ++inside;
      }
    }
    EXPECT_GT(inside, 0) << "no round of the engine's channel started while a group was on the "
                            "wire";
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
