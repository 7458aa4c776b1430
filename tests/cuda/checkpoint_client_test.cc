// The C++ client's checkpoint calls (client.h: SaveBucketState, LoadBucketState) over gRPC
// against one engine behind the service (device_engine_server.h, on the CPU path and on the fake
// device): a record of several 512 KiB chunks saved after two steps and loaded by a restarted
// trainer (a new job on the same daemon) makes the next step's output equal the uninterrupted
// one bit for bit; corrupt and truncated records are DataLoss, another size FailedPrecondition,
// and the daemon goes on serving (the same bucket then loads the good record).
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/cuda/device_engine_server.h"
#include "tests/support/fake_device.h"

namespace spex::test {
namespace {

constexpr size_t kN = 300007;  // a record of 1.2 MB: three chunks

// An engine (the fake device's, or the CPU path's for a null device) served over gRPC on a unix
// socket of this process, stopped and unlinked when it goes out of scope.
class Served : public ServedEngine {
 public:
  explicit Served(fake::FakeDevice* device)
      : ServedEngine(device != nullptr ? DeviceEngineServer::Start(device, {1, true})
                                       : DeviceEngineServer::Start(
                                             static_cast<fake::FakeNode*>(nullptr), {1, true}),
                     device != nullptr ? "ckpttest-dev" : "ckpttest-cpu") {}
};

void Fill(Bucket* b, int step) {
  absl::Span<float> in = b->input();
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<float>(static_cast<int>((i * 2654435761u ^ (step * 7919u)) % 33) - 16);
  }
}

class CheckpointClientTest : public ::testing::TestWithParam<bool> {};

TEST_P(CheckpointClientTest, RestartedTrainerContinuesAndBadRecordsAreRefused) {
  const bool on_device = GetParam();
  fake::FakeDevice device(/*ordinal=*/0);
  fake::FakeIpcOpener::Log log;
  Served served(on_device ? &device : nullptr);
  ASSERT_TRUE(served.status().ok()) << served.status();
  ClientOptions co;
  co.socket = served.socket();
  if (on_device) {
    co.device = v1::DEVICE_CUDA;
    co.ipc_opener = [&log] { return std::make_unique<fake::FakeIpcOpener>(&log); };
  }
  std::string record;
  std::vector<float> want;
  {
    auto client = Client::Connect(co);
    ASSERT_TRUE(client.ok()) << client.status();
    auto b = (*client)->RegisterBucket(3, kN, {"micro", 0.01});
    ASSERT_TRUE(b.ok()) << b.status();
    for (int s = 0; s < 2; ++s) {
      Fill(*b, s);
      ASSERT_TRUE((*client)->Exchange(*b).ok());
    }
    auto saved = (*client)->SaveBucketState(**b);
    ASSERT_TRUE(saved.ok()) << saved.status();
    record = *saved;
    EXPECT_GT(record.size(), 2 * (size_t{1} << 19));
    Fill(*b, 2);
    ASSERT_TRUE((*client)->Exchange(*b).ok());
    want.assign((*b)->output().begin(), (*b)->output().end());
  }  // Goodbye: the job ends, its buckets go
  auto client = Client::Connect(co);
  ASSERT_TRUE(client.ok()) << client.status();
  auto b = (*client)->RegisterBucket(3, kN, {"micro", 0.01});
  ASSERT_TRUE(b.ok()) << b.status();
  std::string corrupt = record;
  corrupt[corrupt.size() / 3] ^= 0x40;
  absl::Status s = (*client)->LoadBucketState(**b, corrupt);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  s = (*client)->LoadBucketState(**b, record.substr(0, record.size() - 5));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  auto small = (*client)->RegisterBucket(4, kN / 2, {"micro", 0.01});
  ASSERT_TRUE(small.ok()) << small.status();
  s = (*client)->LoadBucketState(**small, record);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("(300007 elements), this is bucket 4 (150003 elements)"),
            std::string::npos)
      << s;
  ASSERT_TRUE((*client)->LoadBucketState(**b, record).ok());
  Fill(*small, 0);
  Fill(*b, 2);
  ASSERT_TRUE((*client)->Start(*small).ok());  // bucket 4 is at step 0 like bucket 3
  ASSERT_TRUE((*client)->Exchange(*b).ok());
  ASSERT_TRUE((*client)->Wait(*small).ok());
  absl::Span<const float> got = (*b)->output();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
      << "the restored bucket's step differs from the uninterrupted one";
  for (const std::string& v : device.violations()) ADD_FAILURE() << v;
}

INSTANTIATE_TEST_SUITE_P(CpuAndDevice, CheckpointClientTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "device" : "cpu";
                         });

}  // namespace
}  // namespace spex::test
