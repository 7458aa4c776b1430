// Limits: a request that would take more memory than a bucket, a session or the daemon may hold
// is refused with RESOURCE_EXHAUSTED naming the limit and its flag before anything is allocated;
// so are too many buckets per session, and request strings longer than the daemon accepts (whose
// errors quote a short prefix only). The engine keeps serving afterwards.
#include <string>

#include "daemon/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/support/engine_cluster.h"

namespace spex::test {
namespace {

EngineClusterOptions OneNode(int trainers) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.trainers = trainers;
  return o;
}

TEST(Limits, AHugeBucketIsRefusedBeforeAnythingIsAllocated) {
  EngineCluster cluster(OneNode(2));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto t = Trainer::Open(&cluster.engine(0), 0, 2);
  ASSERT_TRUE(t.ok()) << t.status();
  // 3,000,000,000 elements: ~36 GB with two slots, an output and an accumulator.
  auto g = t->Register(1, 3000000000ull, "dense", 0);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted) << g.status();
  EXPECT_NE(g.status().message().find("--max_"), std::string::npos) << g.status();
  EXPECT_NE(g.status().message().find("bucket 1 (3000000000 elements)"), std::string::npos);
  EXPECT_TRUE(cluster.engine(0).LinkedSegments().size() <= 1);  // the doorbell only
  EXPECT_TRUE(cluster.engine(0).Buckets().empty());
  // Still serving.
  EXPECT_TRUE(t->Register(2, 1000, "dense", 0).ok());
}

TEST(Limits, BucketSessionAndDaemonLimitsNameTheirFlags) {
  EngineClusterOptions o = OneNode(1);
  // One trainer, dense: a bucket of n elements takes its header and 2 x n floats (input slot,
  // output) in shm, no accumulator.
  o.engine.max_bucket_bytes = 1 << 20;
  o.engine.max_session_bytes = 3 << 20;
  o.engine.max_daemon_bytes = 3 << 20;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto t = Trainer::Open(&cluster.engine(0), 0, 1);
  ASSERT_TRUE(t.ok());
  auto big = t->Register(1, 200000, "dense", 0);  // ~1.6 MB
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("--max_bucket_bytes"), std::string::npos) << big.status();
  // Four buckets of ~0.8 MB: the fourth crosses the session's 3 MiB.
  for (uint64_t b = 10; b < 13; ++b) ASSERT_TRUE(t->Register(b, 100000, "dense", 0).ok()) << b;
  auto fourth = t->Register(13, 100000, "dense", 0);
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(fourth.status().message().find("--max_session_bytes"), std::string::npos)
      << fourth.status();
  EXPECT_NE(fourth.status().message().find("already holds"), std::string::npos);
  // Unregistering gives the room back.
  ASSERT_TRUE(t->Unregister(10).ok());
  EXPECT_TRUE(t->Register(13, 100000, "dense", 0).ok());
}

TEST(Limits, TheDaemonLimitCountsEveryBucketOfTheNode) {
  EngineClusterOptions o = OneNode(2);
  o.engine.max_daemon_bytes = 2 << 20;
  o.engine.max_session_bytes = 1 << 30;  // only the node's total is tight
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto t0 = Trainer::Open(&cluster.engine(0), 0, 2);
  auto t1 = Trainer::Open(&cluster.engine(0), 1, 2);
  ASSERT_TRUE(t0.ok() && t1.ok());
  // Two trainers: 3 x n floats of shm and an accumulator of n: 1.6 MB for n = 100000.
  ASSERT_TRUE(t0->Register(1, 100000, "dense", 0).ok());
  ASSERT_TRUE(t1->Register(1, 100000, "dense", 0).ok());  // the same bucket: no new memory
  auto second = t1->Register(2, 100000, "dense", 0);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(second.status().message().find("--max_daemon_bytes"), std::string::npos)
      << second.status();
}

TEST(Limits, BucketsPerSessionAreCapped) {
  EngineClusterOptions o = OneNode(1);
  o.engine.max_buckets_per_session = 3;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto t = Trainer::Open(&cluster.engine(0), 0, 1);
  ASSERT_TRUE(t.ok());
  for (uint64_t b = 0; b < 3; ++b) ASSERT_TRUE(t->Register(b, 10, "dense", 0).ok());
  auto fourth = t->Register(3, 10, "dense", 0);
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(fourth.status().message().find("--max_buckets_per_session"), std::string::npos)
      << fourth.status();
}

TEST(Limits, LongRequestStringsAreRefusedQuotingAShortPrefix) {
  EngineCluster cluster(OneNode(1));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  const std::string huge(10000, 'x');
  auto hello = Trainer::Open(&cluster.engine(0), 0, 1, huge);
  EXPECT_EQ(hello.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(hello.status().message().size(), 200u) << hello.status();
  auto t = Trainer::Open(&cluster.engine(0), 0, 1);
  ASSERT_TRUE(t.ok());
  for (const auto& params :
       std::vector<std::map<std::string, std::string>>{{{"seed", huge}}, {{huge, "1"}}}) {
    auto g = t->Register(1, 100000, "topk", 0.01, params);
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_LT(g.status().message().size(), 300u) << g.status();
    EXPECT_NE(g.status().message().find("(10000 bytes)"), std::string::npos) << g.status();
  }
  auto name = t->Register(1, 100000, huge, 0.01);
  EXPECT_EQ(name.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(name.status().message().size(), 300u) << name.status();
  std::map<std::string, std::string> many;
  for (int i = 0; i < 100; ++i) many["p" + std::to_string(i)] = "1";
  EXPECT_EQ(t->Register(1, 100000, "topk", 0.01, many).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(t->Register(1, 100000, "topk", 0.01).ok());  // still serving
}

}  // namespace
}  // namespace spex::test
