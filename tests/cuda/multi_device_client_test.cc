// One node's trainers on several GPUs (docs/design.md#multi-gpu) through the service and the
// unchanged C++ client, without a GPU: 4 trainers, each on its own fake GPU of a FakeNode
// (ClientOptions::cuda_device, sent as RegisterBucketRequest.device_ordinal), exchange a dense
// and a sparse (topk) bucket over gRPC; every trainer's output at every step equals, bit for
// bit, what the same trainers get from a CPU-path engine (host buckets). Each trainer's bucket
// lives on its own GPU (Bucket::cuda_device), and a trainer on a GPU the daemon was not given
// is refused naming --devices.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/cuda/device_engine_server.h"
#include "tests/support/fake_device.h"
#include "tests/support/fake_node.h"

namespace spex::test {
namespace {

constexpr uint32_t kTrainers = 4;
constexpr size_t kElements = 30000;
constexpr int kSteps = 4;

// An engine (on `node`, or the CPU path for null) served over gRPC on a unix socket of this
// process, stopped and unlinked when it goes out of scope.
class Served : public ServedEngine {
 public:
  Served(fake::FakeNode* node, const std::string& tag)
      : ServedEngine(DeviceEngineServer::Start(node, {kTrainers, true}), "mdevtest-" + tag) {}
};

float Value(uint32_t t, int s, int b, size_t i) {
  return static_cast<float>(std::sin(0.001 * static_cast<double>(i * (t + 3) + s * 7919 + b)) *
                            (1.0 + ((i * 2654435761u) % 61 == 0) * 9.0));
}

// outputs[t][s][b]; `gpus` null: host buckets (the CPU path).
struct ClientRun {
  std::vector<std::vector<std::vector<std::vector<float>>>> outputs;
  std::vector<std::string> errors;
  std::vector<int> bucket_gpu;  // each trainer's Bucket::cuda_device
};

ClientRun RunClients(const std::string& socket, const std::vector<int>* gpus) {
  ClientRun r;
  r.outputs.assign(kTrainers, std::vector<std::vector<std::vector<float>>>(
                                  kSteps, std::vector<std::vector<float>>(2)));
  r.errors.assign(kTrainers, "");
  r.bucket_gpu.assign(kTrainers, -2);
  fake::FakeIpcOpener::Log logs[kTrainers];
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < kTrainers; ++t) {
    threads.emplace_back([&, t] {
      std::string& err = r.errors[t];
      ClientOptions co;
      co.socket = socket;
      co.local_rank = t;
      co.local_size = kTrainers;
      if (gpus != nullptr) {
        co.device = v1::DEVICE_CUDA;
        co.cuda_device = (*gpus)[t];
        co.ipc_opener = [&logs, t] { return std::make_unique<fake::FakeIpcOpener>(&logs[t]); };
      }
      auto client = Client::Connect(co);
      if (!client.ok()) return void(err = client.status().ToString());
      auto dense = (*client)->RegisterBucket(1, kElements, {"dense", 0});
      if (!dense.ok()) return void(err = dense.status().ToString());
      auto sparse = (*client)->RegisterBucket(2, kElements, {"topk", 0.01});
      if (!sparse.ok()) return void(err = sparse.status().ToString());
      r.bucket_gpu[t] = (*dense)->cuda_device();
      for (int s = 0; s < kSteps; ++s) {
        const ExchangeMode mode = (s + t) % 2 ? ExchangeMode::kRpc : ExchangeMode::kDoorbell;
        Bucket* buckets[2] = {*dense, *sparse};
        for (int b = 0; b < 2; ++b) {
          absl::Span<float> in = buckets[b]->input();
          for (size_t i = 0; i < kElements; ++i) in[i] = Value(t, s, b, i);
          absl::Status st = (*client)->Exchange(buckets[b], mode, nullptr);
          if (!st.ok()) return void(err = st.ToString());
          absl::Span<const float> out = buckets[b]->output();
          r.outputs[t][s][b].assign(out.begin(), out.end());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  return r;
}

TEST(MultiDeviceClient, FourTrainersOnFourGpusMatchTheCpuPathBitForBit) {
  ClientRun cpu;
  {
    Served served(nullptr, "cpu");
    ASSERT_TRUE(served.status().ok()) << served.status();
    cpu = RunClients(served.socket(), nullptr);
  }
  for (bool peer : {true, false}) {
    SCOPED_TRACE(peer ? "peer access" : "staged copies");
    const std::vector<int> gpus = {0, 1, 2, 3};
    fake::FakeNode node(gpus, peer);
    ClientRun dev;
    {
      Served served(&node, peer ? "peer" : "staged");
      ASSERT_TRUE(served.status().ok()) << served.status();
      dev = RunClients(served.socket(), &gpus);
    }
    for (const std::string& e : cpu.errors) ASSERT_EQ(e, "") << "CPU path";
    for (const std::string& e : dev.errors) ASSERT_EQ(e, "") << "4 GPUs";
    int differing = 0;
    for (uint32_t t = 0; t < kTrainers; ++t) {
      EXPECT_EQ(dev.bucket_gpu[t], gpus[t]) << "trainer " << t << "'s bucket";
      EXPECT_EQ(cpu.bucket_gpu[t], -1);
      for (int s = 0; s < kSteps; ++s) {
        for (int b = 0; b < 2; ++b) {
          const auto& x = cpu.outputs[t][s][b];
          const auto& y = dev.outputs[t][s][b];
          differing += x.size() != y.size() ||
                       std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0;
        }
      }
    }
    EXPECT_EQ(differing, 0);
    for (const std::string& v : node.violations()) ADD_FAILURE() << v;
    const fake::FakeNode::LinkStats st = node.stats();
    EXPECT_GT(peer ? st.peer_copies : st.staged_copies, 0u);
    EXPECT_EQ(peer ? st.staged_copies : st.peer_copies, 0u);
  }
}

TEST(MultiDeviceClient, AGpuTheDaemonWasNotGivenIsRefusedNamingTheFlag) {
  fake::FakeNode node({0, 1}, true);
  Served served(&node, "refused");
  ASSERT_TRUE(served.status().ok()) << served.status();
  fake::FakeIpcOpener::Log log;
  ClientOptions co;
  co.socket = served.socket();
  co.local_rank = 0;
  co.local_size = kTrainers;
  co.device = v1::DEVICE_CUDA;
  co.cuda_device = 6;
  co.ipc_opener = [&log] { return std::make_unique<fake::FakeIpcOpener>(&log); };
  auto client = Client::Connect(co);
  ASSERT_TRUE(client.ok()) << client.status();
  auto bucket = (*client)->RegisterBucket(1, 1000, {"dense", 0});
  ASSERT_FALSE(bucket.ok());
  EXPECT_EQ(bucket.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(bucket.status().message().find("--devices=0,1"), std::string::npos) << bucket.status();
  EXPECT_NE(bucket.status().message().find("GPU 6"), std::string::npos) << bucket.status();
  for (const auto& d : node.devices()) EXPECT_EQ(d->live_buffers(), 0);
}

}  // namespace
}  // namespace spex::test
