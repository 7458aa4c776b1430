// The memory limits (--max_bucket_bytes, --max_session_bytes, --max_daemon_bytes) count memory on
// every GPU of --devices (issue 33): a trainer registering on a GPU other than the home one adds
// its own buffer there (DeviceBucketBytes(n, 1)) to what its bucket, its session and the daemon
// hold, so a registration that fits on the home GPU is refused on another GPU once that buffer
// passes a limit, naming the flag and the GPU, with nothing allocated; the session's share is
// given back on unregistration, and a buffer reused on re-registration is not counted twice.
// On the fake node of fake_node.h (two fake GPUs).
#include <memory>
#include <string>

#include "daemon/engine/engine.h"
#include "gtest/gtest.h"
#include "proto/contract/layout.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/fake_node.h"

namespace spex::test {
namespace {

using fake::FakeNode;

constexpr uint64_t kN = 100000;
constexpr uint64_t kBucket = 3;

// A dense bucket of 2 local trainers on the device path: the home buffer (2 slots and the
// output), its header page and the local sum (BucketTable::Footprint).
uint64_t HomeBytes() { return DeviceBucketBytes(kN, 2) + kPageBytes + 4 * kN; }
// A trainer's own buffer on another GPU.
uint64_t RemoteBytes() { return DeviceBucketBytes(kN, 1); }

struct Node {
  explicit Node(const EngineOptions& limits) : fake({0, 1}, /*peer_access=*/true) {
    EngineClusterOptions o;
    o.nodes = 1;
    o.trainers = 2;
    o.engine = limits;
    o.engine.shm_tag = "mdevlimit";
    o.parts = [this](int) { return NodeParts{fake.device_prims(), fake.path()}; };
    cluster = std::make_unique<EngineCluster>(o);
  }
  FakeNode fake;
  std::unique_ptr<EngineCluster> cluster;
};

void ExpectRefused(const absl::StatusOr<BucketGrant>& g, const char* flag) {
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted) << g.status();
  const std::string m(g.status().message());
  EXPECT_NE(m.find(flag), std::string::npos) << m;
  EXPECT_NE(m.find("on GPU 1"), std::string::npos) << m;
}

TEST(MultiDeviceLimits, TheDaemonLimitCountsTheOtherGpus) {
  EngineOptions limits;
  limits.max_daemon_bytes = HomeBytes() + RemoteBytes() - 1;
  limits.max_bucket_bytes = limits.max_session_bytes = uint64_t{1} << 40;  // only the node's
  Node node(limits);
  ASSERT_TRUE(node.cluster->status().ok()) << node.cluster->status();
  auto t0 = Trainer::Open(&node.cluster->engine(0), 0, 2);
  auto t1 = Trainer::Open(&node.cluster->engine(0), 1, 2);
  ASSERT_TRUE(t0.ok() && t1.ok());
  ASSERT_TRUE(t0->Register(kBucket, kN, "dense", 0, {}, 0).ok());  // the home GPU: fits
  ExpectRefused(t1->Register(kBucket, kN, "dense", 0, {}, 1), "--max_daemon_bytes");
  EXPECT_EQ(node.fake.device(1)->live_buffers(), 0);
  ASSERT_TRUE(t1->Register(kBucket, kN, "dense", 0, {}, 0).ok());  // on the home GPU it fits
  for (const std::string& v : node.fake.violations()) ADD_FAILURE() << v;
}

TEST(MultiDeviceLimits, ExactlyAtTheLimitFitsAndAReusedBufferIsNotCountedTwice) {
  EngineOptions limits;
  limits.max_daemon_bytes = HomeBytes() + RemoteBytes();
  Node node(limits);
  ASSERT_TRUE(node.cluster->status().ok()) << node.cluster->status();
  auto t0 = Trainer::Open(&node.cluster->engine(0), 0, 2);
  auto t1 = Trainer::Open(&node.cluster->engine(0), 1, 2);
  ASSERT_TRUE(t0.ok() && t1.ok());
  ASSERT_TRUE(t0->Register(kBucket, kN, "dense", 0, {}, 0).ok());
  ASSERT_TRUE(t1->Register(kBucket, kN, "dense", 0, {}, 1).ok());
  EXPECT_EQ(node.fake.device(1)->live_buffers(), 1);
  // Unregistered and back on GPU 1: its buffer there is kept and reused, nothing new.
  ASSERT_TRUE(t1->Unregister(kBucket).ok());
  ASSERT_TRUE(t1->Register(kBucket, kN, "dense", 0, {}, 1).ok());
  EXPECT_EQ(node.fake.device(1)->live_buffers(), 1);
}

TEST(MultiDeviceLimits, TheSessionAndBucketLimitsCountTheTrainersGpu) {
  for (const char* flag : {"--max_session_bytes", "--max_bucket_bytes"}) {
    SCOPED_TRACE(flag);
    EngineOptions limits;
    (flag[6] == 's' ? limits.max_session_bytes : limits.max_bucket_bytes) =
        HomeBytes() + RemoteBytes() - 1;
    Node node(limits);
    ASSERT_TRUE(node.cluster->status().ok()) << node.cluster->status();
    auto t0 = Trainer::Open(&node.cluster->engine(0), 0, 2);
    ASSERT_TRUE(t0.ok());
    ExpectRefused(t0->Register(kBucket, kN, "dense", 0, {}, 1), flag);
    EXPECT_EQ(node.fake.device(1)->live_buffers(), 0);
    EXPECT_TRUE(node.cluster->engine(0).Buckets().empty());
    ASSERT_TRUE(t0->Register(kBucket, kN, "dense", 0, {}, 0).ok());
  }
}

TEST(MultiDeviceLimits, UnregisteringGivesTheSessionItsBytesBack) {
  EngineOptions limits;
  limits.max_session_bytes = HomeBytes() + RemoteBytes();
  Node node(limits);
  ASSERT_TRUE(node.cluster->status().ok()) << node.cluster->status();
  auto t0 = Trainer::Open(&node.cluster->engine(0), 0, 2);
  auto t1 = Trainer::Open(&node.cluster->engine(0), 1, 2);
  ASSERT_TRUE(t0.ok() && t1.ok());
  ASSERT_TRUE(t1->Register(kBucket, kN, "dense", 0, {}, 0).ok());  // keeps the bucket alive
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(t0->Register(kBucket, kN, "dense", 0, {}, 1).ok()) << "round " << round;
    // A second bucket does not fit beside it in this session.
    ExpectRefused(t0->Register(kBucket + 1, kN, "dense", 0, {}, 1), "--max_session_bytes");
    ASSERT_TRUE(t0->Unregister(kBucket).ok());
  }
}

}  // namespace
}  // namespace spex::test
