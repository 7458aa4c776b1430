// Zero-copy input (trainer_memory.h, RegisterBucketRequest.own_input): a trainer's own
// shared-memory file as its input slot. On 2 nodes x 2 trainers (this process plays every
// trainer, with its own pid and uid, so the daemon takes its descriptors as it takes a real
// trainer's): local trainer 0 of each node hands over a memfd, trainer 1 writes its slot; the
// average is exact and follows what the memfd holds at each step (read every step, not copied at
// registration), whatever trainer 0's slot holds. A memfd shrunk under the daemon fails its
// bucket's step (DataLoss naming the trainer) while another bucket goes on. A descriptor that is
// no shared-memory file, a closed one, one too small, another user's, a session without a pid,
// and a repeated registration naming other memory are refused with errors naming own_input, and
// leave nothing registered. TrainerMemory alone: the /proc/<pid>/fd path without a pidfd.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "daemon/engine/engine.h"
#include "daemon/memory/segment_guard.h"
#include "daemon/memory/trainer_memory.h"
#include "gtest/gtest.h"
#include "tests/support/engine_cluster.h"

namespace spex::test {
namespace {

constexpr int kNodes = 2, kTrainers = 2;
constexpr uint64_t kA = 1, kB = 2;
constexpr uint64_t kElems = 3000;  // not a page multiple: the offset below is not page-aligned

float Value(int node, int trainer, uint64_t step, size_t i) {
  return static_cast<float>(static_cast<int>((node * 5 + trainer * 3 + step * 7 + i) % 11) - 5);
}

// A memfd of `bytes` bytes mapped read-write (the trainer's own view of its memory).
struct Memfd {
  explicit Memfd(size_t bytes) : size(bytes) {
    fd = static_cast<int>(syscall(SYS_memfd_create, "own-input-test", MFD_CLOEXEC));
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) return;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) base = static_cast<uint8_t*>(p);
  }
  ~Memfd() {
    if (base != nullptr) munmap(base, size);
    if (fd >= 0) close(fd);
  }
  int fd = -1;
  size_t size;
  uint8_t* base = nullptr;
};

class OwnInput : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineClusterOptions o;
    o.nodes = kNodes;
    o.trainers = kTrainers;
    o.engine.shm_tag = "owninput";
    cluster_ = std::make_unique<EngineCluster>(o);
    ASSERT_TRUE(cluster_->status().ok()) << cluster_->status();
    for (int node = 0; node < kNodes; ++node) {
      for (int r = 0; r < kTrainers; ++r) {
        auto t =
            Trainer::Open(&cluster_->engine(node), r, kTrainers, "", "test", getpid(), getuid());
        ASSERT_TRUE(t.ok()) << t.status();
        trainers_.push_back(std::make_unique<Trainer>(std::move(*t)));
      }
    }
  }

  Trainer& T(int node, int r) { return *trainers_[node * kTrainers + r]; }

  // Step `step` of `bucket` on every trainer (the RPC path): trainer 0 of each node writes its
  // memfd (at `offset` bytes), trainer 1 its slot; trainer 0's slot holds garbage. Statuses in
  // trainer order.
  std::vector<absl::Status> Step(uint64_t bucket, uint64_t step, std::vector<Memfd*> own,
                                 size_t offset) {
    for (int node = 0; node < kNodes; ++node) {
      float* mine = reinterpret_cast<float*>(own[node]->base + offset);
      for (size_t i = 0; i < kElems; ++i) {
        mine[i] = Value(node, 0, step, i);
        T(node, 0).input(bucket)[i] = 1e6f;  // never read
        T(node, 1).input(bucket)[i] = Value(node, 1, step, i);
      }
    }
    std::vector<absl::Status> out(kNodes * kTrainers);
    std::vector<std::thread> threads;
    for (int k = 0; k < kNodes * kTrainers; ++k) {
      threads.emplace_back(
          [&, k] { out[k] = trainers_[k]->Exchange(bucket, step, absl::Seconds(20)).status(); });
    }
    for (auto& th : threads) th.join();
    return out;
  }

  void ExpectExact(uint64_t bucket, uint64_t step, std::vector<Memfd*> own, size_t offset) {
    std::vector<absl::Status> s = Step(bucket, step, own, offset);
    for (int k = 0; k < kNodes * kTrainers; ++k) ASSERT_TRUE(s[k].ok()) << "trainer " << k << s[k];
    for (size_t i = 0; i < kElems; ++i) {
      float sum = 0;
      for (int node = 0; node < kNodes; ++node) {
        for (int r = 0; r < kTrainers; ++r) sum += Value(node, r, step, i);
      }
      ASSERT_EQ(T(0, 0).output(bucket)[i], sum / 4) << "bucket " << bucket << " i " << i;
      ASSERT_EQ(T(1, 1).output(bucket)[i], sum / 4) << "bucket " << bucket << " i " << i;
    }
  }

  std::unique_ptr<EngineCluster> cluster_;
  std::vector<std::unique_ptr<Trainer>> trainers_;
};

TEST_F(OwnInput, TheTrainersMemoryIsReadAtEveryStepInsteadOfItsSlot) {
  constexpr size_t kOffset = 8 * 1000;  // bytes before the bucket in the file
  Memfd m0(kOffset + kElems * 4), m1(kOffset + kElems * 4), b0(kElems * 4), b1(kElems * 4);
  ASSERT_NE(m0.base, nullptr);
  ASSERT_NE(m1.base, nullptr);
  for (int node = 0; node < kNodes; ++node) {
    const TrainerInputSpec spec{node == 0 ? m0.fd : m1.fd, kOffset};
    auto g = T(node, 0).Register(kA, kElems, "dense", 0, {}, -1, &spec);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(g->own_input);
    auto g1 = T(node, 1).Register(kA, kElems, "dense", 0);
    ASSERT_TRUE(g1.ok()) << g1.status();
    EXPECT_FALSE(g1->own_input);
    const TrainerInputSpec spec_b{node == 0 ? b0.fd : b1.fd, 0};
    ASSERT_TRUE(T(node, 0).Register(kB, kElems, "dense", 0, {}, -1, &spec_b).ok());
    ASSERT_TRUE(T(node, 1).Register(kB, kElems, "dense", 0).ok());
  }
  // The daemon holds its own duplicate: the trainer may close its descriptor.
  for (uint64_t step = 0; step < 3; ++step) {
    ExpectExact(kA, step, {&m0, &m1}, kOffset);
    ExpectExact(kB, step, {&b0, &b1}, 0);
  }

  // Registered again naming the same memory: nothing changes; other memory or none: refused.
  const TrainerInputSpec same{m0.fd, kOffset};
  EXPECT_TRUE(T(0, 0).Register(kA, kElems, "dense", 0, {}, -1, &same).ok());
  const TrainerInputSpec other{b0.fd, 0};
  absl::StatusOr<BucketGrant> g = T(0, 0).Register(kA, kElems, "dense", 0, {}, -1, &other);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
  EXPECT_TRUE(absl::StrContains(g.status().message(), "own_input")) << g.status();
  g = T(0, 0).Register(kA, kElems, "dense", 0);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
  ExpectExact(kA, 3, {&m0, &m1}, kOffset);
  ExpectExact(kB, 3, {&b0, &b1}, 0);  // steps go in (step, bucket id) order on every node

  // Node 0's trainer 0 shrinks its memory of bucket A: A's step fails on every node, naming it
  // on node 0; B goes on exactly; the daemon lives.
  const int repairs = SegmentGuard::repairs();
  ASSERT_EQ(ftruncate(m0.fd, 4096), 0);
  munmap(m0.base, m0.size);
  m0.base = static_cast<uint8_t*>(
      mmap(nullptr, m0.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  std::vector<absl::Status> s = Step(kA, 4, {&m0, &m1}, kOffset);
  for (int k = 0; k < kNodes * kTrainers; ++k) EXPECT_FALSE(s[k].ok()) << "trainer " << k;
  EXPECT_EQ(s[0].code(), absl::StatusCode::kDataLoss) << s[0];
  EXPECT_TRUE(absl::StrContains(s[0].message(), "local trainer 0 shrank the memory")) << s[0];
  EXPECT_GT(SegmentGuard::repairs(), repairs);
  ExpectExact(kB, 4, {&b0, &b1}, 0);
}

TEST_F(OwnInput, BadDescriptorsAreRefusedAndLeaveNothingRegistered) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  Memfd small(kElems * 4 - 4), ok(kElems * 4);
  struct Case {
    TrainerInputSpec spec;
    absl::StatusCode code;
    const char* says;
  } cases[] = {
      {{-1, 0}, absl::StatusCode::kInvalidArgument, "own_input.fd must be"},
      {{987654, 0}, absl::StatusCode::kInvalidArgument, "not an open descriptor"},
      {{pipe_fds[0], 0}, absl::StatusCode::kInvalidArgument, "not a shared-memory file"},
      {{small.fd, 0}, absl::StatusCode::kInvalidArgument, "the file holds"},
      {{ok.fd, 8}, absl::StatusCode::kInvalidArgument, "the file holds"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<BucketGrant> g = T(0, 0).Register(kA, kElems, "dense", 0, {}, -1, &c.spec);
    EXPECT_EQ(g.status().code(), c.code) << c.says << ": " << g.status();
    EXPECT_TRUE(absl::StrContains(g.status().message(), c.says)) << g.status();
    EXPECT_TRUE(absl::StrContains(g.status().message(), "bucket 1")) << g.status();
  }
  // A session whose process is unknown (no SO_PEERCRED): nothing to take the descriptor from.
  ASSERT_TRUE(T(1, 0).Goodbye().ok());
  auto anon = Trainer::Open(&cluster_->engine(1), 0, kTrainers);
  ASSERT_TRUE(anon.ok()) << anon.status();
  const TrainerInputSpec spec{ok.fd, 0};
  absl::StatusOr<BucketGrant> g = anon->Register(kA, kElems, "dense", 0, {}, -1, &spec);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
  EXPECT_TRUE(absl::StrContains(g.status().message(), "own_input")) << g.status();
  // Nothing was created: the bucket registers normally afterwards, on both engines.
  for (int node = 0; node < kNodes; ++node) {
    EXPECT_TRUE(cluster_->engine(node).Buckets().empty()) << "node " << node;
  }
  EXPECT_TRUE(T(0, 0).Register(kA, kElems, "dense", 0, {}, -1, &spec).ok());
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(TrainerMemory, ProcPathWithoutPidfdAndOwnerCheck) {
  Memfd m(kElems * 4);
  ASSERT_NE(m.base, nullptr);
  std::memcpy(m.base, "spex", 4);
  const TrainerInputSpec spec{m.fd, 0};
  auto mapped = TrainerMemory::Map(-1, getpid(), getuid(), spec, kElems * 4);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(std::memcmp((*mapped)->data(), "spex", 4), 0);
  m.base[0] = 'S';  // shared, not a copy
  EXPECT_EQ(static_cast<const uint8_t*>((*mapped)->data())[0], 'S');
  auto again = TrainerMemory::Map(-1, getpid(), getuid(), spec, kElems * 4);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*mapped)->Same(**again));
  auto stranger = TrainerMemory::Map(-1, getpid(), getuid() + 1, spec, kElems * 4);
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kInvalidArgument) << stranger.status();
  EXPECT_TRUE(absl::StrContains(stranger.status().message(), "hand over memory of your own"));
}

}  // namespace
}  // namespace spex::test
