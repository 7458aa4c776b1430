// The C++ client's zero-copy input (client.h: OwnInput, SharedInputMemory) over gRPC against one
// engine on the CPU path behind the service (device_engine_server.h; the service's caller is
// this process, so spexd takes the descriptor from this process): a bucket registered with a
// memfd at an unaligned offset is read from that memory at every step (input() points there, and
// the output follows what is written there, never the slot); bad OwnInputs are refused before
// the call and a file spexd cannot take is refused by it, each registering nothing.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/cuda/device_engine_server.h"
#include "tests/support/fake_node.h"

namespace spex::test {
namespace {

// One trainer's client of a CPU-path engine served on a socket named after the test.
class OwnInputClient : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string tag =
        absl::StrCat("owninput-", ::testing::UnitTest::GetInstance()->current_test_info()->line());
    served_ = std::make_unique<ServedEngine>(
        DeviceEngineServer::Start(static_cast<fake::FakeNode*>(nullptr), {1, false}), tag);
    ASSERT_TRUE(served_->status().ok()) << served_->status();
    ClientOptions co;
    co.socket = served_->socket();
    auto c = Client::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  void TearDown() override {
    client_.reset();  // Goodbye before the server stops
    served_.reset();
  }

  std::unique_ptr<ServedEngine> served_;
  std::unique_ptr<Client> client_;
};

constexpr size_t kN = 10007;
constexpr uint64_t kOffset = 4 * 1001;  // not page-aligned

TEST_F(OwnInputClient, TheDaemonReadsTheTrainersOwnMemoryAtEveryStep) {
  auto mem = SharedInputMemory::Create(kOffset + kN * sizeof(float));
  ASSERT_TRUE(mem.ok()) << mem.status();
  const OwnInput own = (*mem)->At(kOffset);
  auto b = client_->RegisterBucket(1, kN, {"dense"}, v1::DTYPE_FLOAT32, &own);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*b)->own_input());
  float* mine = static_cast<float*>(own.data);
  EXPECT_EQ((*b)->input().data(), mine);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < kN; ++i) mine[i] = static_cast<float>((i * 7 + step * 13) % 101) - 50;
    ASSERT_TRUE(client_->Exchange(*b).ok()) << "step " << step;
    absl::Span<const float> out = (*b)->output();
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_EQ(out[i], mine[i]) << "step " << step << ", element " << i;  // 1 node, 1 trainer
    }
  }
  // The split form reads it too.
  for (size_t i = 0; i < kN; ++i) mine[i] = 0.5f;
  ASSERT_TRUE(client_->Start(*b).ok());
  ASSERT_TRUE(client_->Wait(*b).ok());
  EXPECT_EQ((*b)->output()[kN - 1], 0.5f);
}

TEST_F(OwnInputClient, RefusalsRegisterNothing) {
  auto mem = SharedInputMemory::Create(kN * sizeof(float));
  ASSERT_TRUE(mem.ok()) << mem.status();

  OwnInput no_fd = (*mem)->At(0);
  no_fd.fd = -1;
  auto r = client_->RegisterBucket(2, kN, {"dense"}, v1::DTYPE_FLOAT32, &no_fd);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("fd >= 0"), std::string::npos) << r.status();
  OwnInput odd = (*mem)->At(2);  // a float32 bucket at a 2-byte offset
  r = client_->RegisterBucket(2, kN, {"dense"}, v1::DTYPE_FLOAT32, &odd);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  // More elements than the file holds from the offset: spexd refuses, naming own_input.
  const OwnInput short_file = (*mem)->At(4);
  r = client_->RegisterBucket(2, kN, {"dense"}, v1::DTYPE_FLOAT32, &short_file);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("own_input"), std::string::npos) << r.status();
  // A regular file that is not shared memory: refused by spexd too.
  char path[] = "/tmp/spex-owninput-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, kN * sizeof(float)), 0);
  OwnInput on_disk = (*mem)->At(0);
  on_disk.fd = fd;
  r = client_->RegisterBucket(3, kN, {"dense"}, v1::DTYPE_FLOAT32, &on_disk);
  close(fd);
  if (r.ok()) {
    // /tmp is itself a tmpfs on some machines: then spexd rightly takes it.
    GTEST_LOG_(INFO) << "/tmp is on tmpfs here; the non-shared-memory refusal is not exercised";
  } else {
    EXPECT_NE(r.status().message().find("own_input"), std::string::npos) << r.status();
  }
  // None of the refusals registered bucket 2: it registers now, without own_input.
  auto plain = client_->RegisterBucket(2, kN, {"dense"});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE((*plain)->own_input());
}

}  // namespace
}  // namespace spex::test
