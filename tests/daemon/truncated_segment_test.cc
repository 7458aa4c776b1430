// A trainer that shrinks its bucket's shared segment (ftruncate on the /dev/shm file it mapped)
// must not bring the daemon down: before the segment guard the engine's next read raised SIGBUS
// and killed the process (and, under mpirun, every node). On 2 nodes x 1 trainer: node 0's
// bucket A segment is cut behind its header, then to nothing; each time bucket A's step fails on
// both nodes with an error, bucket B goes on with exact results, the process lives, and after the
// job the engines serve a new one exactly. And the cut nobody touches afterwards: node 0's
// segment of bucket A goes to nothing, header included, before any failure, while node 0's
// trainer (another process in real life, whose writes never reach the daemon's memory) does not
// touch it again. Node 1's step of A still fails within seconds (not its exchange timeout),
// naming node 0 and node 0's reason (the shrunk segment, carried by the commit vote), for the
// per-bucket path and a merger's, dense and sparse; bucket B goes on, and the next job runs
// exactly from its first step.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/engine/engine.h"
#include "daemon/memory/segment_guard.h"
#include "daemon/memory/shm_buffer.h"
#include "gtest/gtest.h"
#include "proto/contract/layout.h"
#include "tests/support/engine_cluster.h"

namespace spex::test {
namespace {

constexpr int kNodes = 2;
constexpr uint64_t kA = 1, kB = 2;
constexpr uint64_t kElems = 4096;

float Value(int node, uint64_t bucket, uint64_t step, size_t i) {
  return static_cast<float>(static_cast<int>((node * 3 + bucket * 5 + step * 7 + i) % 13) - 6);
}

class TruncatedSegment : public ::testing::Test {
 protected:
  void SetUp() override { Start(MergerPolicy::kNone); }

  void Start(MergerPolicy merger) {
    cluster_.reset();
    EngineClusterOptions o;
    o.nodes = kNodes;
    o.engine.shm_tag = "trunc";
    o.engine.merger = merger;
    cluster_ = std::make_unique<EngineCluster>(o);
    ASSERT_TRUE(cluster_->status().ok()) << cluster_->status();
  }

  void OpenJob() {
    trainers_.clear();
    for (int node = 0; node < kNodes; ++node) {
      auto t = Trainer::Open(&cluster_->engine(node), 0, 1);
      ASSERT_TRUE(t.ok()) << t.status();
      trainers_.push_back(std::make_unique<Trainer>(std::move(*t)));
    }
  }

  // Step `step` of `bucket` on every node at once (the RPC path); each node's status.
  std::vector<absl::Status> Step(uint64_t bucket, uint64_t step) {
    std::vector<absl::Status> out(kNodes);
    std::vector<std::thread> threads;
    for (int node = 0; node < kNodes; ++node) {
      threads.emplace_back([&, node] {
        Trainer& t = *trainers_[node];
        t.Fill(bucket, [&](size_t i) { return Value(node, bucket, step, i); });
        out[node] = t.Exchange(bucket, step, absl::Seconds(20)).status();
      });
    }
    for (auto& th : threads) th.join();
    return out;
  }

  void ExpectExact(uint64_t bucket, uint64_t step) {
    std::vector<absl::Status> s = Step(bucket, step);
    for (int node = 0; node < kNodes; ++node) {
      ASSERT_TRUE(s[node].ok()) << "node " << node << ": " << s[node];
      const float* out = trainers_[node]->output(bucket);
      for (size_t i = 0; i < kElems; ++i) {
        const float want = (Value(0, bucket, step, i) + Value(1, bucket, step, i)) / 2;
        ASSERT_EQ(out[i], want) << "node " << node << " bucket " << bucket << " i " << i;
      }
    }
  }

  std::unique_ptr<EngineCluster> cluster_;
  std::vector<std::unique_ptr<Trainer>> trainers_;
};

TEST_F(TruncatedSegment, ShrunkSegmentFailsItsBucketNotTheDaemon) {
  OpenJob();
  std::vector<int> fds;
  for (uint64_t bucket : {kA, kB}) {
    for (int node = 0; node < kNodes; ++node) {
      auto g = trainers_[node]->Register(bucket, kElems, "dense", 0);
      ASSERT_TRUE(g.ok()) << g.status();
    }
  }
  // What a hostile trainer keeps: its own descriptor of the segment, opened while it is linked.
  const ShmBuffer* seg = trainers_[0]->grant(kA).buffer;
  const int fd = shm_open(seg->name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0) << "the segment " << seg->name() << " is unlinked already";
  ExpectExact(kA, 0);
  ExpectExact(kB, 0);
  const int repairs = SegmentGuard::repairs();

  // Cut behind the header: the input slots are gone, the ready words stay.
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(InputOffset(kElems, 0))), 0);
  std::vector<absl::Status> s = Step(kA, 1);
  for (int node = 0; node < kNodes; ++node) {
    EXPECT_FALSE(s[node].ok()) << "node " << node << " published a step over vanished inputs";
  }
  EXPECT_TRUE(absl::StrContains(s[0].message(), "shrank the bucket's shared segment")) << s[0];
  // The other node gets node 0's reason too, not only "node 0 failed bucket B step S".
  EXPECT_EQ(s[1].code(), absl::StatusCode::kDataLoss) << s[1];
  EXPECT_TRUE(absl::StrContains(s[1].message(), "node 0 failed bucket")) << s[1];
  EXPECT_TRUE(absl::StrContains(s[1].message(), "shrank the bucket's shared segment")) << s[1];
  EXPECT_TRUE(seg->pulled());
  EXPECT_EQ(SegmentGuard::repairs(), repairs + 1);
  ExpectExact(kB, 1);  // the other bucket carries on
  // Later steps of A keep failing, promptly.
  s = Step(kA, 2);
  EXPECT_FALSE(s[0].ok());
  EXPECT_FALSE(s[1].ok());

  // To nothing, header included: still no crash.
  ASSERT_EQ(ftruncate(fd, 0), 0);
  Step(kA, 3);
  close(fd);

  // The job ends; both engines serve the next one exactly.
  for (auto& t : trainers_) EXPECT_TRUE(t->Goodbye().ok());
  OpenJob();
  for (int node = 0; node < kNodes; ++node) {
    auto g = trainers_[node]->Register(kA, kElems, "dense", 0);
    ASSERT_TRUE(g.ok()) << g.status();
  }
  ExpectExact(kA, 0);
  ExpectExact(kA, 1);
}

// The cut to nothing, header included, before anything failed, with node 0's trainer gone
// quiet about A: node 0's engine notices the cut when it next reads the header (its reaper reads
// every waiting bucket's) and runs A's step so that it fails there and at every other node.
TEST_F(TruncatedSegment, CutToNothingBeforeAnyFailureFailsEveryNodePromptly) {
  struct Case {
    const char* compressor;
    MergerPolicy merger;
    const char* name;
  };
  for (const Case& c : {Case{"dense", MergerPolicy::kNone, "dense, merger none"},
                        Case{"topk", MergerPolicy::kNone, "topk, merger none"},
                        Case{"dense", MergerPolicy::kFixed, "dense, merger fixed"}}) {
    SCOPED_TRACE(c.name);
    Start(c.merger);
    OpenJob();
    const bool dense = std::string(c.compressor) == "dense";
    for (uint64_t bucket : {kA, kB}) {
      for (int node = 0; node < kNodes; ++node) {
        auto g = trainers_[node]->Register(bucket, kElems, c.compressor, dense ? 0 : 0.25);
        ASSERT_TRUE(g.ok()) << g.status();
      }
    }
    const ShmBuffer* seg = trainers_[0]->grant(kA).buffer;
    const int fd = shm_open(seg->name().c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0) << "the segment " << seg->name() << " is unlinked already";
    for (uint64_t step : {0, 1}) {
      for (uint64_t bucket : {kA, kB}) {
        std::vector<absl::Status> s = Step(bucket, step);
        for (int node = 0; node < kNodes; ++node) ASSERT_TRUE(s[node].ok()) << s[node];
      }
    }
    ASSERT_FALSE(seg->pulled());
    ASSERT_EQ(ftruncate(fd, 0), 0);
    close(fd);

    // Step 2: node 1 hands in A and B, node 0 only B (its trainer stays away from A).
    absl::Status a, b[kNodes];
    absl::Duration took;
    {
      std::vector<std::thread> threads;
      threads.emplace_back([&] {
        const absl::Time t0 = absl::Now();
        trainers_[1]->Fill(kA, [&](size_t i) { return Value(1, kA, 2, i); });
        a = trainers_[1]->Exchange(kA, 2, absl::Seconds(20)).status();
        took = absl::Now() - t0;
      });
      for (int node = 0; node < kNodes; ++node) {
        threads.emplace_back([&, node] {
          trainers_[node]->Fill(kB, [&](size_t i) { return Value(node, kB, 2, i); });
          b[node] = trainers_[node]->Exchange(kB, 2, absl::Seconds(20)).status();
        });
      }
      for (auto& th : threads) th.join();
    }
    EXPECT_FALSE(a.ok()) << "node 1 published step 2 of A without node 0's inputs";
    EXPECT_LT(took, absl::Seconds(5)) << "node 1 waited " << took << " for a cut segment: " << a;
    EXPECT_EQ(a.code(), absl::StatusCode::kDataLoss) << a;
    EXPECT_TRUE(absl::StrContains(a.message(), "node 0")) << a;
    EXPECT_TRUE(absl::StrContains(a.message(), "shrank the bucket's shared segment")) << a;
    EXPECT_TRUE(seg->pulled());
    for (const BucketSummary& s : cluster_->engine(0).Buckets()) {
      if (s.bucket_id == kA) {
        EXPECT_EQ(s.state, "failed");
      }
    }
    for (int node = 0; node < kNodes; ++node) {
      // Under a merger B shares A's pack (one fused exchange), so it fails with it, promptly.
      if (c.merger != MergerPolicy::kNone && !b[node].ok()) {
        EXPECT_EQ(b[node].code(), absl::StatusCode::kDataLoss) << b[node];
        continue;
      }
      EXPECT_TRUE(b[node].ok()) << "node " << node << " bucket B: " << b[node];
      if (!dense || !b[node].ok()) continue;
      const float* out = trainers_[node]->output(kB);
      size_t bad = 0;
      for (size_t i = 0; i < kElems; ++i)
        bad += out[i] != (Value(0, kB, 2, i) + Value(1, kB, 2, i)) / 2;
      EXPECT_EQ(bad, 0u) << "node " << node << " bucket B step 2";
    }

    // The job ends; the next one runs exactly from its first step on both engines.
    for (auto& t : trainers_) EXPECT_TRUE(t->Goodbye().ok());
    OpenJob();
    for (int node = 0; node < kNodes; ++node) {
      auto g = trainers_[node]->Register(kA, kElems, "dense", 0);
      ASSERT_TRUE(g.ok()) << g.status();
    }
    ExpectExact(kA, 0);
    ExpectExact(kA, 1);
    for (auto& t : trainers_) EXPECT_TRUE(t->Goodbye().ok());
    trainers_.clear();
  }
}

}  // namespace
}  // namespace spex::test
