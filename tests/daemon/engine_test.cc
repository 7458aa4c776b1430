// The engine over the in-process collective: N nodes as threads, L trainers per node driving
// it through both signalling paths (doorbell in the shared header, and the Exchange call).
#include "daemon/engine/engine.h"

#include <sys/stat.h>

#include <atomic>
#include <thread>

#include "daemon/memory/futex.h"
#include "daemon/transport/inproc_collective.h"
#include "gtest/gtest.h"
#include "kernels/reference/reference_primitives.h"

namespace spex {
namespace {

struct Node {
  std::unique_ptr<Collective> coll;
  std::unique_ptr<Engine> engine;
};

class Cluster {
 public:
  Cluster(int nodes, int trainers, EngineOptions base = {})
      : hub_(nodes, absl::Seconds(10)), prims_(MakeReferencePrimitives()) {
    for (int n = 0; n < nodes; ++n) {
      Node node;
      node.coll = hub_.Connect(n);
      EngineOptions o = base;
      o.local_trainers = trainers;
      o.shm_tag = "enginetest";
      node.engine = std::make_unique<Engine>(o, node.coll.get(), prims_.get());
      EXPECT_TRUE(node.engine->Start().ok());
      nodes_.push_back(std::move(node));
    }
  }
  ~Cluster() {
    for (auto& n : nodes_) n.engine->RequestStop();
  }
  Engine& engine(int n) { return *nodes_[n].engine; }
  int size() const { return static_cast<int>(nodes_.size()); }

 private:
  InProcessHub hub_;
  std::unique_ptr<Primitives> prims_;
  std::vector<Node> nodes_;
};

float Value(int node, int trainer, uint64_t bucket, uint64_t step, size_t i) {
  // Integer values: sums are exact in any order, so results can be compared bit for bit.
  uint64_t x = (static_cast<uint64_t>(node) << 56) ^ (static_cast<uint64_t>(trainer) << 48) ^
               (bucket << 40) ^ (step << 32) ^ i;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<float>(static_cast<int>((x ^ (x >> 31)) % 2001) - 1000);
}

// The doorbell path as a client does it, directly on the shared segments.
void MarkReady(DoorbellSegment* bell, const BucketGrant& g, uint32_t rank, uint64_t step) {
  auto* h = static_cast<BucketHeader*>(const_cast<ShmBuffer*>(g.buffer)->data());
  h->ready[rank].value.store(step + 1);
  bell->ring.fetch_add(1);
  if (bell->engine_sleeping.load()) FutexWake(&bell->ring);
}

void WaitPublished(const BucketGrant& g, uint64_t step) {
  auto* h = static_cast<BucketHeader*>(const_cast<ShmBuffer*>(g.buffer)->data());
  h->waiters.fetch_add(1);
  for (uint32_t cur; (cur = h->published.load()) != static_cast<uint32_t>(step + 1);) {
    FutexWait(&h->published, cur, 100 * 1000 * 1000);
  }
  h->waiters.fetch_sub(1);
}

TEST(EngineTest, EveryTrainerGetsTheExactAverageOverBothPaths) {
  for (int nodes : {2, 4}) {
    const int L = 2;
    Cluster cluster(nodes, L);
    const std::vector<uint64_t> sizes = {1, 31, 4099, 70000};
    const int steps = 4;
    std::atomic<int> failures{0};
    std::vector<std::thread> trainers;
    for (int n = 0; n < nodes; ++n) {
      for (int r = 0; r < L; ++r) {
        trainers.emplace_back([&, n, r] {
          Engine& e = cluster.engine(n);
          auto hello = e.Hello("", r, L, 0, "test");
          ASSERT_TRUE(hello.ok()) << hello.status();
          std::vector<BucketGrant> grants;
          for (size_t b = 0; b < sizes.size(); ++b) {
            auto g = e.RegisterBucket(hello->session_id, b, sizes[b], "", 0);
            ASSERT_TRUE(g.ok()) << g.status();
            grants.push_back(*g);
          }
          for (int s = 0; s < steps; ++s) {
            for (size_t b = 0; b < sizes.size(); ++b) {
              uint8_t* base =
                  static_cast<uint8_t*>(const_cast<ShmBuffer*>(grants[b].buffer)->data());
              float* in = reinterpret_cast<float*>(base + grants[b].input_offset);
              for (size_t i = 0; i < sizes[b]; ++i) in[i] = Value(n, r, b, s, i);
            }
            if (r % 2 == 0) {
              // The blocking RPC path, in canonical order.
              for (size_t b = 0; b < sizes.size(); ++b) {
                auto rec = e.Exchange(hello->session_id, b, s, absl::Now() + absl::Seconds(20));
                ASSERT_TRUE(rec.ok()) << rec.status();
              }
            } else {
              // The doorbell path, marking buckets ready in reverse order (odd nodes) or
              // in order: the order signals arrive in must not matter.
              auto* bell =
                  static_cast<DoorbellSegment*>(const_cast<ShmBuffer*>(hello->doorbell)->data());
              for (size_t k = 0; k < sizes.size(); ++k) {
                size_t b = (n % 2) ? sizes.size() - 1 - k : k;
                MarkReady(bell, grants[b], r, s);
              }
              for (size_t b = 0; b < sizes.size(); ++b) WaitPublished(grants[b], s);
            }
            for (size_t b = 0; b < sizes.size(); ++b) {
              const uint8_t* base =
                  static_cast<const uint8_t*>(const_cast<ShmBuffer*>(grants[b].buffer)->data());
              const float* out = reinterpret_cast<const float*>(base + grants[b].output_offset);
              for (size_t i = 0; i < sizes[b]; ++i) {
                float sum = 0;
                for (int nn = 0; nn < nodes; ++nn)
                  for (int rr = 0; rr < L; ++rr) sum += Value(nn, rr, b, s, i);
                if (out[i] != sum / (nodes * L)) failures++;
              }
            }
          }
          EXPECT_TRUE(e.Goodbye(hello->session_id).ok());
        });
      }
    }
    for (auto& t : trainers) t.join();
    EXPECT_EQ(failures.load(), 0) << nodes << " nodes";
    for (int n = 0; n < nodes; ++n)
      EXPECT_EQ(cluster.engine(n).total_exchanges(), sizes.size() * steps);
  }
}

TEST(EngineTest, DoorbellPathPublishesWithoutTheRpc) {
  Cluster cluster(2, 1);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int n = 0; n < 2; ++n) {
    threads.emplace_back([&, n] {
      Engine& e = cluster.engine(n);
      auto hello = e.Hello("", 0, 1, 0, "test");
      ASSERT_TRUE(hello.ok());
      auto* bell = static_cast<DoorbellSegment*>(const_cast<ShmBuffer*>(hello->doorbell)->data());
      auto g = e.RegisterBucket(hello->session_id, 9, 1000, "", 0);
      ASSERT_TRUE(g.ok());
      auto* h = static_cast<BucketHeader*>(const_cast<ShmBuffer*>(g->buffer)->data());
      float* in = reinterpret_cast<float*>(
          static_cast<uint8_t*>(const_cast<ShmBuffer*>(g->buffer)->data()) + g->input_offset);
      const float* out = reinterpret_cast<const float*>(
          static_cast<uint8_t*>(const_cast<ShmBuffer*>(g->buffer)->data()) + g->output_offset);
      for (int s = 0; s < 20; ++s) {
        for (int i = 0; i < 1000; ++i) in[i] = static_cast<float>(n + s + i);
        MarkReady(bell, *g, 0, s);
        WaitPublished(*g, s);
        EXPECT_EQ(h->status.load(), 0);
        for (int i = 0; i < 1000; ++i) {
          if (out[i] != (static_cast<float>(s + i) + static_cast<float>(1 + s + i)) / 2) bad++;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(EngineTest, BadRequestsGetClearErrorsAndTheEngineKeepsServing) {
  EngineOptions o;
  o.register_wait = absl::Milliseconds(300);
  Cluster cluster(1, 2, o);
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
  Cluster cluster(2, 1);
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int n = 0; n < 2; ++n) {
    threads.emplace_back([&, n] {
      Engine& e = cluster.engine(n);
      auto hello = e.Hello("", 0, 1, 0, "t");
      ASSERT_TRUE(hello.ok());
      // Node 0 registers bucket 5 with 100 elements, node 1 with 200.
      ASSERT_TRUE(e.RegisterBucket(hello->session_id, 5, n == 0 ? 100 : 200, "", 0).ok());
      results[n] = e.Exchange(hello->session_id, 5, 0, absl::Now() + absl::Seconds(10)).status();
    });
  }
  for (auto& t : threads) t.join();
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(results[n].code(), absl::StatusCode::kFailedPrecondition) << results[n];
    EXPECT_NE(results[n].message().find("order differs"), std::string::npos) << results[n];
  }
}

TEST(EngineTest, SegmentsAreUnlinkedOnceEveryTrainerAttached) {
  Cluster cluster(1, 2);
  Engine& e = cluster.engine(0);
  auto a = e.Hello("", 0, 2, 0, "a");
  auto b = e.Hello("", 1, 2, 0, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  auto ga = e.RegisterBucket(a->session_id, 3, 100, "", 0);
  ASSERT_TRUE(ga.ok());
  const std::string name = ga->buffer->name();
  struct stat st;
  EXPECT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto gb = e.RegisterBucket(b->session_id, 3, 100, "", 0);
  ASSERT_TRUE(gb.ok());
  auto* h = static_cast<BucketHeader*>(const_cast<ShmBuffer*>(ga->buffer)->data());
  auto* bell = static_cast<DoorbellSegment*>(const_cast<ShmBuffer*>(a->doorbell)->data());
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

}  // namespace
}  // namespace spex

namespace spex {
namespace {

// DDP rebuilds its buckets after the first iteration: the old ids are withdrawn and new ids
// registered; the schedule must move on instead of waiting for the old buckets' next step.
TEST(EngineTest, UnregisteredBucketsLeaveTheSchedule) {
  Cluster cluster(2, 1);
  std::vector<std::thread> threads;
  for (int n = 0; n < 2; ++n) {
    threads.emplace_back([&, n] {
      Engine& e = cluster.engine(n);
      auto hello = e.Hello("", 0, 1, 0, "t");
      ASSERT_TRUE(hello.ok());
      const uint64_t sid = hello->session_id;
      auto deadline = [] { return absl::Now() + absl::Seconds(10); };
      ASSERT_TRUE(e.RegisterBucket(sid, 0, 10, "", 0).ok());
      ASSERT_TRUE(e.RegisterBucket(sid, 1, 10, "", 0).ok());
      ASSERT_TRUE(e.Exchange(sid, 0, 0, deadline()).ok());
      ASSERT_TRUE(e.Exchange(sid, 1, 0, deadline()).ok());
      ASSERT_TRUE(e.UnregisterBucket(sid, 0).ok());
      EXPECT_EQ(e.UnregisterBucket(sid, 0).code(), absl::StatusCode::kNotFound);
      ASSERT_TRUE(e.RegisterBucket(sid, 1000, 20, "", 0).ok());
      // Bucket 0 would come first at step 1; it is gone, so these complete.
      EXPECT_TRUE(e.Exchange(sid, 1000, 0, deadline()).ok());
      EXPECT_TRUE(e.Exchange(sid, 1, 1, deadline()).ok());
      EXPECT_EQ(e.Exchange(sid, 0, 1, deadline()).status().code(), absl::StatusCode::kNotFound);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace spex
