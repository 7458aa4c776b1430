// The engine over the in-process collective: N nodes as threads, L trainers per node driving
// it through both signalling paths (doorbell in the shared header, and the Exchange call), on
// the fixture of tests/support/engine_cluster.h.
#include "daemon/engine/engine.h"

#include <sys/stat.h>

#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "proto/contract/futex.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/synthetic_gradient.h"

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

// Integer values: sums are exact in any order, so results can be compared bit for bit.
float Value(int node, int trainer, uint64_t bucket, uint64_t step, size_t i) {
  return IntegerGradient({node, trainer, bucket, step, i});
}

TEST(EngineTest, EveryTrainerGetsTheExactAverageOverBothPaths) {
  for (int nodes : {2, 4}) {
    const int L = 2;
    EngineCluster cluster(Shape(nodes, L));
    ASSERT_TRUE(cluster.status().ok()) << cluster.status();
    const std::vector<uint64_t> sizes = {1, 31, 4099, 70000};
    const int steps = 4;
    std::atomic<int> failures{0};
    cluster.ForEachTrainer([&](int n, int r) {
      auto t = Trainer::Open(&cluster.engine(n), r, L);
      ASSERT_TRUE(t.ok()) << t.status();
      for (size_t b = 0; b < sizes.size(); ++b) {
        auto g = t->Register(b, sizes[b]);
        ASSERT_TRUE(g.ok()) << g.status();
      }
      for (int s = 0; s < steps; ++s) {
        for (size_t b = 0; b < sizes.size(); ++b) {
          t->Fill(b, [&](size_t i) { return Value(n, r, b, s, i); });
        }
        if (r % 2 == 0) {
          // The blocking RPC path, in canonical order.
          for (size_t b = 0; b < sizes.size(); ++b) {
            auto rec = t->Exchange(b, s);
            ASSERT_TRUE(rec.ok()) << rec.status();
          }
        } else {
          // The doorbell path, marking buckets ready in reverse order (odd nodes) or
          // in order: the order signals arrive in must not matter.
          for (size_t k = 0; k < sizes.size(); ++k) {
            size_t b = (n % 2) ? sizes.size() - 1 - k : k;
            t->MarkReady(b, s);
          }
          for (size_t b = 0; b < sizes.size(); ++b) EXPECT_TRUE(t->WaitPublished(b, s).ok());
        }
        for (size_t b = 0; b < sizes.size(); ++b) {
          const float* out = t->output(b);
          for (size_t i = 0; i < sizes[b]; ++i) {
            float sum = 0;
            for (int nn = 0; nn < nodes; ++nn)
              for (int rr = 0; rr < L; ++rr) sum += Value(nn, rr, b, s, i);
            if (out[i] != sum / (nodes * L)) failures++;
          }
        }
      }
      EXPECT_TRUE(t->Goodbye().ok());
    });
    EXPECT_EQ(failures.load(), 0) << nodes << " nodes";
    for (int n = 0; n < nodes; ++n)
      EXPECT_EQ(cluster.engine(n).total_exchanges(), sizes.size() * steps);
  }
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

TEST(EngineTest, BadRequestsGetClearErrorsAndTheEngineKeepsServing) {
  EngineOptions o;
  o.register_wait = absl::Milliseconds(300);
  EngineCluster cluster(Shape(1, 2, o));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  Engine& e = cluster.engine(0);
  auto s0 = e.Hello("", 0, 2, 0, "t0");
  ASSERT_TRUE(s0.ok());
  // Wrong local_size, duplicate local rank.
  EXPECT_EQ(e.Hello("", 1, 3, 0, "t").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.Hello("", 0, 2, 0, "t").status().code(), absl::StatusCode::kAlreadyExists);
  // Unknown compressor names the accepted ones.
  auto bad = e.RegisterBucket(s0->session_id, 1, 10, "nosuch", 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("accepted"), std::string::npos);
  // Registered twice with another size.
  ASSERT_TRUE(e.RegisterBucket(s0->session_id, 1, 10, "", 0).ok());
  auto twice = e.RegisterBucket(s0->session_id, 1, 11, "", 0);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("10 elements"), std::string::npos) << twice.status();
  // Exchange for an unknown bucket.
  EXPECT_EQ(e.Exchange(s0->session_id, 77, 0, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
  // Exchange before the second local trainer registered: times out with a clear status.
  auto early = e.Exchange(s0->session_id, 1, 0, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.status().message().find("only 1 of 2"), std::string::npos) << early.status();
  // Wrong step.
  EXPECT_EQ(e.Exchange(s0->session_id, 1, 5, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Still serving: the second trainer arrives and step 0 completes for both.
  auto s1 = e.Hello("", 1, 2, 0, "t1");
  ASSERT_TRUE(s1.ok());
  ASSERT_TRUE(e.RegisterBucket(s1->session_id, 1, 10, "", 0).ok());
  std::thread other(
      [&] { EXPECT_TRUE(e.Exchange(s1->session_id, 1, 0, absl::Now() + absl::Seconds(5)).ok()); });
  EXPECT_TRUE(e.Exchange(s0->session_id, 1, 0, absl::Now() + absl::Seconds(5)).ok());
  other.join();
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
