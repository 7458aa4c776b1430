// The engine over the in-process collective on the CPU path, what the conformance suite
// (tests/support/engine_conformance.h: exact dense averages over both signalling paths, bad
// requests) does not cover: the doorbell alone, bucket order differing between nodes, segments
// unlinked once attached, unregistered buckets leaving the schedule; on the fixture of
// tests/support/engine_cluster.h.
#include "daemon/engine/engine.h"

#include <sys/stat.h>

#include <atomic>

#include "gtest/gtest.h"
#include "proto/contract/futex.h"
#include "tests/support/engine_cluster.h"

namespace spex::test {
namespace {

EngineClusterOptions Shape(int nodes, int trainers, EngineOptions base = {}) {
  EngineClusterOptions o;
  o.nodes = nodes;
  o.trainers = trainers;
  o.engine = base;
  o.engine.shm_tag = "enginetest";
  o.hub_timeout = absl::Seconds(10);
  return o;
}

TEST(EngineTest, DoorbellPathPublishesWithoutTheRpc) {
  EngineCluster cluster(Shape(2, 1));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::atomic<int> bad{0};
  cluster.ForEachNode([&](int n) {
    auto t = Trainer::Open(&cluster.engine(n), 0, 1);
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(t->Register(9, 1000).ok());
    BucketHeader* h = t->header(9);
    float* in = t->input(9);
    const float* out = t->output(9);
    for (int s = 0; s < 20; ++s) {
      for (int i = 0; i < 1000; ++i) in[i] = static_cast<float>(n + s + i);
      t->MarkReady(9, s);
      EXPECT_TRUE(t->WaitPublished(9, s).ok());
      EXPECT_EQ(h->status.load(), 0);
      for (int i = 0; i < 1000; ++i) {
        if (out[i] != (static_cast<float>(s + i) + static_cast<float>(1 + s + i)) / 2) bad++;
      }
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(EngineTest, DifferentBucketOrderBetweenNodesIsAnErrorNotAHang) {
  EngineCluster cluster(Shape(2, 1));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<absl::Status> results(2);
  cluster.ForEachNode([&](int n) {
    auto t = Trainer::Open(&cluster.engine(n), 0, 1);
    ASSERT_TRUE(t.ok());
    // Node 0 registers bucket 5 with 100 elements, node 1 with 200.
    ASSERT_TRUE(t->Register(5, n == 0 ? 100 : 200).ok());
    results[n] = t->Exchange(5, 0, absl::Seconds(10)).status();
  });
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(results[n].code(), absl::StatusCode::kFailedPrecondition) << results[n];
    EXPECT_NE(results[n].message().find("order differs"), std::string::npos) << results[n];
  }
}

TEST(EngineTest, SegmentsAreUnlinkedOnceEveryTrainerAttached) {
  EngineCluster cluster(Shape(1, 2));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  Engine& e = cluster.engine(0);
  auto a = Trainer::Open(&e, 0, 2, "", "a");
  auto b = Trainer::Open(&e, 1, 2, "", "b");
  ASSERT_TRUE(a.ok() && b.ok());
  auto ga = a->Register(3, 100);
  ASSERT_TRUE(ga.ok());
  const std::string name = ga->buffer->name();
  struct stat st;
  EXPECT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto gb = b->Register(3, 100);
  ASSERT_TRUE(gb.ok());
  BucketHeader* h = a->header(3);
  DoorbellSegment* bell = a->doorbell();
  h->attached[0].store(1);
  h->attached[1].store(1);
  bell->attached[0].store(1);
  bell->attached[1].store(1);
  bell->ring.fetch_add(1);
  FutexWake(&bell->ring);
  for (int i = 0; i < 200 && !e.LinkedSegments().empty(); ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(e.LinkedSegments().empty());
  EXPECT_NE(stat(("/dev/shm" + name).c_str(), &st), 0);
}

// DDP rebuilds its buckets after the first iteration: the old ids are withdrawn and new ids
// registered; the schedule must move on instead of waiting for the old buckets' next step.
TEST(EngineTest, UnregisteredBucketsLeaveTheSchedule) {
  EngineCluster cluster(Shape(2, 1));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  cluster.ForEachNode([&](int n) {
    auto t = Trainer::Open(&cluster.engine(n), 0, 1);
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(t->Register(0, 10).ok());
    ASSERT_TRUE(t->Register(1, 10).ok());
    ASSERT_TRUE(t->Exchange(0, 0, absl::Seconds(10)).ok());
    ASSERT_TRUE(t->Exchange(1, 0, absl::Seconds(10)).ok());
    ASSERT_TRUE(t->Unregister(0).ok());
    EXPECT_EQ(cluster.engine(n).UnregisterBucket(t->session_id(), 0).code(),
              absl::StatusCode::kNotFound);
    ASSERT_TRUE(t->Register(1000, 20).ok());
    // Bucket 0 would come first at step 1; it is gone, so these complete.
    EXPECT_TRUE(t->Exchange(1000, 0, absl::Seconds(10)).ok());
    EXPECT_TRUE(t->Exchange(1, 1, absl::Seconds(10)).ok());
    EXPECT_EQ(t->Exchange(0, 1, absl::Seconds(10)).status().code(), absl::StatusCode::kNotFound);
  });
}

}  // namespace
}  // namespace spex::test
