// One node's trainers on several GPUs (docs/design.md#multi-gpu), without a GPU: the engine's
// device path on a FakeNode (fake_node.h: several fake devices, with or without peer access)
// against the CPU path:
//  - 1 node x 4 trainers on 4 devices and 2 nodes x 2 trainers on 2 devices each (one node with
//    peer access, one without): every trainer's output at every step equals the CPU path's bit
//    for bit, for a dense bucket and a sparse one (topk, micro);
//  - the home device's primitives never see another device's memory (the gather and the
//    delivery go through the link), every remote trainer's input event is waited for and its
//    output event recorded on its own device once per step, and the copies are peer copies
//    with peer access and host-staged without;
//  - a trainer on a GPU the daemon was not given is refused naming --devices, leaving nothing
//    allocated; a CPU-path engine refuses a GPU; moving a registered bucket to another GPU is
//    refused; a failing input event on a remote GPU fails the step on every node, and the
//    bucket goes on.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/fake_device.h"
#include "tests/support/fake_node.h"
#include "tests/support/synthetic_gradient.h"

namespace spex::test {
namespace {

using fake::FakeNode;

constexpr uint64_t kSparseBucket = 7;
constexpr uint64_t kDenseBucket = 9;
constexpr size_t kSparseElements = 20011;
constexpr size_t kDenseElements = 3001;

// Roughly Gaussian and not integers, so the order of additions shows in the bits.
float Value(int node, int trainer, uint64_t bucket, uint64_t step, size_t i) {
  return Gradient({node, trainer, bucket, step, i}, {GradientShape::kUniform, 1e-2, 89, 7.0});
}

struct Layout {
  int nodes = 1;
  int trainers = 4;
  // devices[node]: the node's GPU ordinals (the first is home); trainer t is on
  // devices[node][t % size]. Empty: the CPU path.
  std::vector<std::vector<int>> devices;
  std::vector<bool> peer;  // per node
  std::string compressor = "topk";
  int steps = 5;
};

struct Run {
  // outputs[node][trainer][step][b], b: 0 sparse, 1 dense
  std::vector<std::vector<std::vector<std::vector<std::vector<float>>>>> outputs;
  std::vector<std::unique_ptr<FakeNode>> nodes;
  std::vector<std::string> errors;
};

EngineClusterOptions Options(const Layout& l, std::vector<std::unique_ptr<FakeNode>>* nodes) {
  EngineClusterOptions o;
  o.nodes = l.nodes;
  o.trainers = l.trainers;
  o.engine.shm_tag = "mdevtest";
  o.engine.min_sparse_elements = 0;
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.residual_norm_every = 1;
  if (l.devices.empty()) {
    o.cpu_primitives = true;
    return o;
  }
  for (int n = 0; n < l.nodes; ++n) {
    nodes->push_back(std::make_unique<FakeNode>(l.devices[n], l.peer[n]));
  }
  o.parts = [nodes](int n) {
    FakeNode* f = (*nodes)[n].get();
    return NodeParts{f->device_prims(), f->path()};
  };
  o.wrap = [nodes](int n, std::unique_ptr<Collective> c) {
    return fake::CheckedCollective(std::move(c), (*nodes)[n]->home());
  };
  return o;
}

int DeviceOf(const Layout& l, int node, int trainer) {
  if (l.devices.empty()) return -1;
  const std::vector<int>& d = l.devices[node];
  return d[trainer % d.size()];
}

Run RunLayout(const Layout& l) {
  const uint64_t ids[2] = {kSparseBucket, kDenseBucket};
  const size_t sizes[2] = {kSparseElements, kDenseElements};
  const std::string compressors[2] = {l.compressor, "dense"};
  Run r;
  r.outputs.assign(l.nodes, std::vector<std::vector<std::vector<std::vector<float>>>>(
                                l.trainers, std::vector<std::vector<std::vector<float>>>(
                                                l.steps, std::vector<std::vector<float>>(2))));
  r.errors.assign(l.nodes * l.trainers, "");
  EngineCluster cluster(Options(l, &r.nodes));
  if (!cluster.status().ok()) {
    r.errors[0] = cluster.status().ToString();
    return r;
  }
  cluster.ForEachTrainer([&](int n, int t) {
    std::string& err = r.errors[n * l.trainers + t];
    auto tr = Trainer::Open(&cluster.engine(n), t, l.trainers);
    if (!tr.ok()) return void(err = tr.status().ToString());
    for (int b = 0; b < 2; ++b) {
      auto g = tr->Register(ids[b], sizes[b], compressors[b], 0.01, {}, DeviceOf(l, n, t));
      if (!g.ok()) return void(err = g.status().ToString());
    }
    for (int s = 0; s < l.steps; ++s) {
      for (int b = 0; b < 2; ++b) {
        tr->Fill(ids[b], [&](size_t i) { return Value(n, t, ids[b], s, i); });
      }
      // Trainer 0 through the RPC path, the others through the doorbell.
      for (int b = 0; b < 2; ++b) {
        if (t == 0) {
          auto rec = tr->Exchange(ids[b], s);
          if (!rec.ok()) return void(err = rec.status().ToString());
        } else {
          absl::Status st = tr->Ring(ids[b], s);
          if (!st.ok()) return void(err = st.ToString());
        }
        r.outputs[n][t][s][b].assign(tr->output(ids[b]), tr->output(ids[b]) + sizes[b]);
      }
    }
  });
  return r;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectSameAsCpu(Layout l) {
  Layout cpu_layout = l;
  cpu_layout.devices.clear();
  const Run cpu = RunLayout(cpu_layout);
  const Run dev = RunLayout(l);
  for (const std::string& e : cpu.errors) ASSERT_EQ(e, "") << "CPU path";
  for (const std::string& e : dev.errors) ASSERT_EQ(e, "") << "several devices";
  int differing = 0;
  for (int n = 0; n < l.nodes; ++n) {
    for (int t = 0; t < l.trainers; ++t) {
      for (int s = 0; s < l.steps; ++s) {
        for (int b = 0; b < 2; ++b) {
          differing += !SameBits(cpu.outputs[n][t][s][b], dev.outputs[n][t][s][b]);
        }
      }
    }
  }
  EXPECT_EQ(differing, 0) << "outputs differing between the CPU path and several devices";

  for (int n = 0; n < l.nodes; ++n) {
    FakeNode& node = *dev.nodes[n];
    for (const std::string& v : node.violations()) ADD_FAILURE() << "node " << n << ": " << v;
    const int home = l.devices[n].front();
    int remote_trainers = 0;
    for (int t = 0; t < l.trainers; ++t) remote_trainers += DeviceOf(l, n, t) != home;
    // Per step and bucket: one gather and one delivery per remote trainer.
    const uint64_t copies = static_cast<uint64_t>(l.steps) * 2 * 2 * remote_trainers;
    const FakeNode::LinkStats st = node.stats();
    if (l.peer[n]) {
      EXPECT_EQ(st.peer_copies, copies) << "node " << n;
      EXPECT_EQ(st.staged_copies, 0u);
    } else {
      EXPECT_EQ(st.staged_copies, copies) << "node " << n;
      EXPECT_EQ(st.peer_copies, 0u);
    }
    // Each device waits for its own trainers' input events and records its output event(s):
    // the home device one per step and bucket, another device one per trainer on it.
    for (const auto& d : node.devices()) {
      int trainers_here = 0;
      for (int t = 0; t < l.trainers; ++t) trainers_here += DeviceOf(l, n, t) == d->ordinal();
      int waits = 0, records = 0;
      for (const fake::Event& e : d->events()) {
        waits += e.kind == fake::Event::kWait;
        records += e.kind == fake::Event::kRecord;
      }
      const bool is_home = d->ordinal() == home;
      EXPECT_EQ(waits, l.steps * 2 * (is_home ? l.trainers - remote_trainers : trainers_here))
          << "node " << n << " GPU " << d->ordinal();
      EXPECT_EQ(records, l.steps * 2 * (is_home ? 1 : trainers_here))
          << "node " << n << " GPU " << d->ordinal();
    }
  }
}

TEST(MultiDevice, OneNodeFourTrainersOnFourDevicesWithPeerAccess) {
  for (const char* c : {"topk", "micro"}) {
    SCOPED_TRACE(c);
    Layout l;
    l.devices = {{0, 1, 2, 3}};
    l.peer = {true};
    l.compressor = c;
    ExpectSameAsCpu(l);
  }
}

TEST(MultiDevice, OneNodeFourTrainersOnFourDevicesWithoutPeerAccess) {
  Layout l;
  l.devices = {{2, 0, 3, 1}};  // the home GPU need not be GPU 0
  l.peer = {false};
  l.compressor = "micro";
  ExpectSameAsCpu(l);
}

TEST(MultiDevice, TwoNodesTwoDevicesEach) {
  for (const char* c : {"topk", "micro"}) {
    SCOPED_TRACE(c);
    Layout l;
    l.nodes = 2;
    l.trainers = 2;
    l.devices = {{0, 1}, {0, 1}};
    l.peer = {true, false};
    l.compressor = c;
    ExpectSameAsCpu(l);
  }
}

// Two trainers share a non-home GPU (each gets a buffer of its own there).
TEST(MultiDevice, TwoTrainersOnOneOtherDevice) {
  Layout l;
  l.trainers = 4;
  l.devices = {{0, 1}};  // trainers 0, 2 on GPU 0; 1, 3 on GPU 1
  l.peer = {false};
  ExpectSameAsCpu(l);
}

TEST(MultiDevice, ADeviceTheDaemonWasNotGivenIsRefusedNamingTheFlag) {
  FakeNode node({0, 1}, /*peer_access=*/true);
  EngineClusterOptions o;
  o.nodes = 1;
  o.trainers = 2;
  o.engine.shm_tag = "mdevtest";
  o.parts = [&node](int) { return NodeParts{node.device_prims(), node.path()}; };
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto t0 = Trainer::Open(&cluster.engine(0), 0, 2);
  auto t1 = Trainer::Open(&cluster.engine(0), 1, 2);
  ASSERT_TRUE(t0.ok() && t1.ok());
  absl::StatusOr<BucketGrant> g = t0->Register(3, 1000, "dense", 0, {}, /*device=*/5);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(g.status().message());
  EXPECT_NE(m.find("bucket 3"), std::string::npos) << m;
  EXPECT_NE(m.find("GPU 5"), std::string::npos) << m;
  EXPECT_NE(m.find("--devices=0,1"), std::string::npos) << m;
  // Nothing was allocated on any device, and no bucket exists.
  for (const auto& d : node.devices()) EXPECT_EQ(d->live_buffers(), 0) << d->ordinal();
  EXPECT_TRUE(cluster.engine(0).Buckets().empty());

  // On GPU 1: a buffer of its own there; moving it to GPU 0 while registered is refused.
  ASSERT_TRUE(t0->Register(3, 1000, "dense", 0, {}, 1).ok());
  EXPECT_EQ(node.device(1)->live_buffers(), 1);
  absl::StatusOr<BucketGrant> moved = t0->Register(3, 1000, "dense", 0, {}, 0);
  ASSERT_FALSE(moved.ok());
  EXPECT_NE(moved.status().message().find("Unregister it first"), std::string::npos)
      << moved.status();
  // After unregistering, trainer 0 may come back on the home GPU: its buffer on GPU 1 goes.
  ASSERT_TRUE(t0->Unregister(3).ok());
  ASSERT_TRUE(t1->Register(3, 1000, "dense", 0, {}, 0).ok());  // keeps the bucket alive
  ASSERT_TRUE(t0->Register(3, 1000, "dense", 0, {}, 0).ok());
  EXPECT_EQ(node.device(1)->live_buffers(), 0);
  for (const std::string& v : node.violations()) ADD_FAILURE() << v;
}

TEST(MultiDevice, TheCpuPathRefusesAGpu) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.trainers = 1;
  o.cpu_primitives = true;
  o.engine.shm_tag = "mdevtest";
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto t = Trainer::Open(&cluster.engine(0), 0, 1);
  ASSERT_TRUE(t.ok());
  absl::StatusOr<BucketGrant> g = t->Register(1, 100, "dense", 0, {}, 0);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(g.status().message().find("--device=cuda"), std::string::npos) << g.status();
}

// A remote GPU whose input event fails at step 1 on node 1: every node fails that step (the
// control round's input-failure word), and the next step goes on.
TEST(MultiDevice, AFailedInputEventOnAnotherDeviceFailsTheStepEverywhere) {
  std::vector<std::unique_ptr<FakeNode>> nodes;
  Layout l;
  l.nodes = 2;
  l.trainers = 2;
  l.devices = {{0, 1}, {0, 1}};
  l.peer = {true, true};
  EngineClusterOptions o = Options(l, &nodes);
  int calls = 0;
  nodes[1]->device(1)->SetWaitFailure([&calls](const fake::FakeBuffer&, int) {
    return ++calls == 2;  // the second wait on GPU 1 of node 1: step 1
  });
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<std::string> status(2 * 2 * 3);
  cluster.ForEachTrainer([&](int n, int t) {
    auto tr = Trainer::Open(&cluster.engine(n), t, 2);
    if (!tr.ok()) return;
    if (!tr->Register(kDenseBucket, 1000, "dense", 0, {}, t).ok()) return;
    for (int s = 0; s < 3; ++s) {
      tr->Fill(kDenseBucket, [&](size_t i) { return Value(n, t, kDenseBucket, s, i); });
      auto rec = tr->Exchange(kDenseBucket, s);
      status[(n * 2 + t) * 3 + s] = rec.ok() ? "OK" : rec.status().ToString();
    }
  });
  for (int n = 0; n < 2; ++n) {
    for (int t = 0; t < 2; ++t) {
      SCOPED_TRACE(absl::StrCat("node ", n, " trainer ", t));
      EXPECT_EQ(status[(n * 2 + t) * 3 + 0], "OK");
      EXPECT_NE(status[(n * 2 + t) * 3 + 1], "OK");
      EXPECT_EQ(status[(n * 2 + t) * 3 + 2], "OK");
    }
  }
  EXPECT_NE(status[(1 * 2 + 1) * 3 + 1].find("GPU"), std::string::npos)
      << status[(1 * 2 + 1) * 3 + 1];
}

}  // namespace
}  // namespace spex::test
