// The shared segments are hostile input (issue 16 item 4): a trainer maps its node's doorbell
// and every bucket's segment read-write and can write anything there. Case by case, on 2 nodes x
// 2 trainers with the trainer of node 0, local rank 0 the hostile one: its ready word going back,
// jumping ahead by one step and by 2^40, every layout word of the bucket headers and of the
// doorbell overwritten (zeros, ones, random, a slot stride and size that would point into
// another bucket), and the headers rewritten without pause while steps run. For each: the
// engine does not crash, the other trainers of both nodes either carry on with exact results or
// get a clear error naming the trainer within seconds (never their exchange timeout), no other
// trainer's input slot and no other bucket is written by the daemon (bit-identical), and the
// engines serve a new job afterwards.
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/engine/engine.h"
#include "gtest/gtest.h"
#include "proto/contract/futex.h"
#include "proto/contract/layout.h"
#include "tests/support/engine_cluster.h"

namespace spex::test {
namespace {

constexpr int kNodes = 2, kLocal = 2;
constexpr uint64_t kA = 7, kB = 8;  // A: the bucket the hostile trainer writes into
constexpr size_t kElems[] = {5000, 3000};
constexpr uint64_t kBuckets[] = {kA, kB};
// Others must be answered well within this (the exchange timeout they are given is 20 s).
constexpr absl::Duration kPrompt = absl::Seconds(5);
const char kBroken[] =
    "local trainer 0 (pid 0) of node 0 broke the shared-segment protocol (its ready word went "
    "back";

bool Hostile(int node, int rank) { return node == 0 && rank == 0; }
// Node 1's trainer 0 waits through the doorbell (published/status in its header), the others
// through the Exchange call.
bool Doorbell(int node, int rank) { return node == 1 && rank == 0; }

// Small integers: every sum and the division by 4 are exact in float.
float Value(int node, int rank, uint64_t bucket, uint64_t step, size_t i) {
  return static_cast<float>(
      static_cast<int>((node * 7 + rank * 3 + bucket * 5 + step * 11 + i) % 17) - 8);
}

struct Outcome {
  absl::Status status[2];  // per bucket (A, B)
  absl::Duration took;
  bool ran = false;
};

class HostileSegment : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineClusterOptions o;
    o.nodes = kNodes;
    o.trainers = kLocal;
    o.engine.shm_tag = "hostile";
    cluster_ = std::make_unique<EngineCluster>(o);
    ASSERT_TRUE(cluster_->status().ok()) << cluster_->status();
    OpenJob();
  }

  void OpenJob() {
    trainers_.clear();
    trainers_.resize(kNodes);
    for (int node = 0; node < kNodes; ++node) {
      for (int rank = 0; rank < kLocal; ++rank) {
        auto t = Trainer::Open(&cluster_->engine(node), rank, kLocal);
        ASSERT_TRUE(t.ok()) << t.status();
        trainers_[node].push_back(std::make_unique<Trainer>(std::move(*t)));
        for (int b = 0; b < 2; ++b) {
          auto g = T(node, rank).Register(kBuckets[b], kElems[b], "dense", 0);
          ASSERT_TRUE(g.ok()) << g.status();
        }
      }
    }
  }

  Trainer& T(int node, int rank) { return *trainers_[node][rank]; }
  BucketHeader* H(uint64_t bucket) { return T(0, 0).header(bucket); }

  // One step of both buckets by every trainer (the hostile one too when `hostile_joins`; else
  // its slots stay as they are). Each checks that the daemon left its input slots as it wrote
  // them and, when OK, that the output is the exact average of every slot of every node.
  std::vector<Outcome> Step(uint64_t step, bool hostile_joins,
                            absl::Duration timeout = absl::Seconds(20)) {
    std::vector<Outcome> out(kNodes * kLocal);
    // The inputs of step `step` of every trainer that joins; the hostile one's slots as they are.
    std::vector<std::vector<float>> sum(2);
    for (int b = 0; b < 2; ++b) {
      sum[b].assign(kElems[b], 0.0f);
      for (size_t i = 0; i < kElems[b]; ++i) {
        for (int node = 0; node < kNodes; ++node) {
          for (int rank = 0; rank < kLocal; ++rank) {
            sum[b][i] += Hostile(node, rank) && !hostile_joins
                             ? T(0, 0).input(kBuckets[b])[i]
                             : Value(node, rank, kBuckets[b], step, i);
          }
        }
      }
    }
    cluster_->ForEachTrainer([&](int node, int rank) {
      if (Hostile(node, rank) && !hostile_joins) return;
      Trainer& t = T(node, rank);
      Outcome& o = out[node * kLocal + rank];
      o.ran = true;
      std::vector<float> wrote[2];
      for (int b = 0; b < 2; ++b) {
        t.Fill(kBuckets[b], [&](size_t i) { return Value(node, rank, kBuckets[b], step, i); });
        wrote[b].assign(t.input(kBuckets[b]), t.input(kBuckets[b]) + kElems[b]);
      }
      const absl::Time t0 = absl::Now();
      for (int b = 0; b < 2; ++b) {
        if (Doorbell(node, rank)) {
          t.MarkReady(kBuckets[b], step);
          o.status[b] = t.WaitPublished(kBuckets[b], step, timeout);
        } else {
          o.status[b] = t.Exchange(kBuckets[b], step, timeout).status();
        }
        if (o.status[b].ok()) {
          const float* y = t.output(kBuckets[b]);
          size_t bad = 0;
          for (size_t i = 0; i < kElems[b]; ++i) bad += y[i] != sum[b][i] / 4;
          EXPECT_EQ(bad, 0u) << "node " << node << " trainer " << rank << " bucket " << kBuckets[b]
                             << " step " << step;
        }
      }
      o.took = absl::Now() - t0;
      for (int b = 0; b < 2; ++b) {
        EXPECT_EQ(std::memcmp(wrote[b].data(), t.input(kBuckets[b]), kElems[b] * sizeof(float)), 0)
            << "the input slot of node " << node << " trainer " << rank << ", bucket "
            << kBuckets[b] << " changed under it";
      }
    });
    return out;
  }

  // Every trainer but the hostile one got OK for both buckets, promptly.
  void ExpectCarriedOn(const std::vector<Outcome>& out, uint64_t step) {
    for (int node = 0; node < kNodes; ++node) {
      for (int rank = 0; rank < kLocal; ++rank) {
        const Outcome& o = out[node * kLocal + rank];
        if (!o.ran) continue;
        SCOPED_TRACE(absl::StrCat("step ", step, " node ", node, " trainer ", rank));
        EXPECT_TRUE(o.status[0].ok()) << o.status[0];
        EXPECT_TRUE(o.status[1].ok()) << o.status[1];
        EXPECT_LT(o.took, kPrompt);
      }
    }
  }

  // Every trainer but the hostile one failed both buckets, promptly, naming it (the doorbell
  // waiter sees the published status code; its message comes from the Exchange call).
  void ExpectBrokenNamed(const std::vector<Outcome>& out, uint64_t step) {
    for (int node = 0; node < kNodes; ++node) {
      for (int rank = 0; rank < kLocal; ++rank) {
        if (Hostile(node, rank)) continue;
        const Outcome& o = out[node * kLocal + rank];
        SCOPED_TRACE(absl::StrCat("step ", step, " node ", node, " trainer ", rank));
        for (const absl::Status& s : o.status) {
          if (Doorbell(node, rank)) {
            EXPECT_NE(s.message().find(absl::StrCat("published error status ",
                                                    static_cast<int>(absl::StatusCode::kAborted))),
                      std::string::npos)
                << s;
          } else {
            EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
            EXPECT_NE(s.message().find(kBroken), std::string::npos) << s;
          }
        }
        EXPECT_LT(o.took, kPrompt);
      }
    }
  }

  // Everybody leaves; a new job on the same engines runs two exact steps.
  void ExpectNewJobServes() {
    for (auto& node : trainers_) {
      for (auto& t : node) t->Goodbye().IgnoreError();
    }
    OpenJob();
    for (uint64_t step = 0; step < 2; ++step) ExpectCarriedOn(Step(step, true), step);
  }

  std::unique_ptr<EngineCluster> cluster_;
  std::vector<std::vector<std::unique_ptr<Trainer>>> trainers_;  // [node][local rank]
};

TEST_F(HostileSegment, ReadyGoingBackFailsEveryTrainerNamingIt) {
  for (uint64_t step = 0; step < 3; ++step) ExpectCarriedOn(Step(step, true), step);
  H(kA)->ready[0].value.store(1);  // it was 3
  ExpectBrokenNamed(Step(3, false), 3);
  // Every later step of its buckets fails alike, at the others' pace.
  ExpectBrokenNamed(Step(4, false), 4);
  ExpectNewJobServes();
}

TEST_F(HostileSegment, ReadyJumpingOneStepAheadRunsThatStepWithItsSlotAsItIs) {
  for (uint64_t step = 0; step < 3; ++step) ExpectCarriedOn(Step(step, true), step);
  // Step 3 as a client would do it, but A's ready says step 4 is in too.
  for (uint64_t b : kBuckets) T(0, 0).Fill(b, [&](size_t i) { return Value(0, 0, b, 3, i); });
  H(kA)->ready[0].value.store(5);
  H(kB)->ready[0].value.store(4);
  T(0, 0).doorbell()->ring.fetch_add(1);
  ExpectCarriedOn(Step(3, false), 3);
  // Step 4 of A runs with the slot as it is; B waits for it as usual.
  H(kB)->ready[0].value.store(5);
  ExpectCarriedOn(Step(4, false), 4);
  // In step again.
  for (uint64_t step = 5; step < 7; ++step) ExpectCarriedOn(Step(step, true), step);
  ExpectNewJobServes();
}

TEST_F(HostileSegment, ReadyJumpingAheadBy2To40CarriesOnUntilItGoesBack) {
  for (uint64_t step = 0; step < 3; ++step) ExpectCarriedOn(Step(step, true), step);
  H(kA)->ready[0].value.store(3 + (1ull << 40));
  for (uint64_t step = 3; step < 6; ++step) {
    H(kB)->ready[0].value.store(step + 1);  // B as usual; A stays "ready" with the slot as it is
    ExpectCarriedOn(Step(step, false), step);
  }
  // Back to what its own count says (step 3): below the bucket's next step (6).
  H(kA)->ready[0].value.store(4);
  ExpectBrokenNamed(Step(6, false), 6);
  ExpectNewJobServes();
}

// Every word of both headers and of the doorbell that the daemon does not read back for its
// schedule (magic, version, id, size, slot count and stride, published, waiters, status,
// attached; the doorbell's ring, sleeping flag, shutdown flag and attached words): the daemon
// keeps its own view of each bucket from registration, so the steps carry on exactly.
TEST_F(HostileSegment, GarbageInEveryLayoutWordIsIgnored) {
  ExpectCarriedOn(Step(0, true), 0);
  std::mt19937_64 rng(16);
  auto* a_base = reinterpret_cast<uint8_t*>(H(kA));
  auto* b_base = reinterpret_cast<uint8_t*>(H(kB));
  enum Pattern { kZeros, kOnes, kRandom, kIntoB, kPatterns };
  for (int p = 0; p < kPatterns; ++p) {
    SCOPED_TRACE(absl::StrCat("pattern ", p));
    auto word = [&](uint64_t fallback) -> uint64_t {
      return p == kZeros ? 0 : p == kOnes ? ~0ull : p == kRandom ? rng() : fallback;
    };
    for (uint64_t bucket : kBuckets) {
      BucketHeader* h = H(bucket);
      // kIntoB: the slot stride and size that would put A's slot 1 (and the output) inside B's
      // segment, and B's slots at A's.
      const uint64_t delta =
          static_cast<uint64_t>(bucket == kA ? b_base - a_base : a_base - b_base);
      h->magic = static_cast<uint32_t>(word(kBucketMagic ^ 1));
      h->version = static_cast<uint32_t>(word(kLayoutVersion + 1));
      h->bucket_id = word(bucket == kA ? kB : kA);
      h->elements = word(kElems[bucket == kA ? 1 : 0] * 1000);
      h->slots = static_cast<uint32_t>(word(kMaxLocalTrainers * 4));
      h->dtype = static_cast<uint32_t>(word(1));  // the daemon keeps its own record of it
      h->slot_stride = word(delta);
      h->published.store(static_cast<uint32_t>(word(12345)));
      h->waiters.store(static_cast<uint32_t>(word(1u << 31)));
      h->status.store(static_cast<int32_t>(word(13)));
      for (auto& at : h->attached) at.store(static_cast<uint32_t>(word(1)));
    }
    DoorbellSegment* bell = T(0, 0).doorbell();  // its own node's: the one it maps
    bell->magic = static_cast<uint32_t>(word(0));
    bell->version = static_cast<uint32_t>(word(99));
    bell->ring.store(static_cast<uint32_t>(word(7)));
    bell->engine_sleeping.store(static_cast<uint32_t>(word(0)));
    bell->shutdown.store(static_cast<uint32_t>(word(1)));
    for (auto& at : bell->attached) at.store(static_cast<uint32_t>(word(1)));
    for (uint64_t step = 1 + 2 * p; step < 3 + 2 * p; ++step) {
      ExpectCarriedOn(Step(step, true), step);
    }
  }
  ExpectNewJobServes();
}

TEST_F(HostileSegment, HeadersRewrittenWhileStepsRunAreIgnored) {
  ExpectCarriedOn(Step(0, true), 0);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> rewrites{0};
  BucketHeader* heads[] = {H(kA), H(kB)};
  DoorbellSegment* bell = T(0, 0).doorbell();
  std::thread vandal([&] {
    std::mt19937_64 rng(4);
    while (!stop.load()) {
      for (BucketHeader* h : heads) {
        h->magic = static_cast<uint32_t>(rng());
        h->version = static_cast<uint32_t>(rng());
        h->bucket_id = rng();
        h->elements = rng();
        h->slots = static_cast<uint32_t>(rng());
        h->slot_stride = rng();
        h->published.store(static_cast<uint32_t>(rng()));
        h->waiters.store(static_cast<uint32_t>(rng()));
        h->status.store(static_cast<int32_t>(rng()));
        h->attached[rng() % kMaxLocalTrainers].store(static_cast<uint32_t>(rng()));
      }
      bell->ring.store(static_cast<uint32_t>(rng()));
      bell->engine_sleeping.store(static_cast<uint32_t>(rng() & 1));
      bell->attached[rng() % kMaxLocalTrainers].store(static_cast<uint32_t>(rng()));
      rewrites++;
      std::this_thread::yield();
    }
  });
  // The vandal is at work before the steps start, and the steps go on (at least five, at most
  // 200) until it has rewritten the headers while they ran: on a loaded machine the thread may
  // not be scheduled during the first few milliseconds.
  while (rewrites.load() == 0) std::this_thread::yield();
  const uint64_t before = rewrites.load();
  // The hostile trainer itself steps honestly (the Exchange call), so every step can run.
  uint64_t step = 1;
  for (; step < 6 || (rewrites.load() == before && step < 200); ++step) {
    ExpectCarriedOn(Step(step, true), step);
  }
  const uint64_t during = rewrites.load() - before;
  stop = true;
  vandal.join();
  EXPECT_GT(during, 0u) << "the headers were never rewritten while " << step - 1 << " steps ran";
  ExpectNewJobServes();
}

}  // namespace
}  // namespace spex::test
