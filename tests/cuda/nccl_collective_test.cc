// The NCCL collective's portable parts (daemon/transport/nccl_collective.h): the AllGatherV
// plan, and the bootstrap agreement run over the in-process collective (threads as ranks):
// one id for everyone, made once, and a shared, named failure when any rank cannot join, never
// a hang. Where a GPU exists (and --config=cuda), a 1-rank NCCL communicator is exercised too.
#include "daemon/transport/nccl_collective.h"

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "daemon/transport/inproc_collective.h"
#include "gtest/gtest.h"

#ifdef SPEX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace spex {
namespace {

template <typename Fn>
void RunRanks(InProcessHub& hub, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < hub.size(); ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Collective> c = hub.Connect(r);
      fn(*c, r);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(PlanAllGatherV, PaddedWhenChunksAreAlike) {
  AllGatherVPlan p = PlanAllGatherV({100, 96, 100, 98});
  EXPECT_TRUE(p.padded);
  EXPECT_EQ(p.block, 100u);
  EXPECT_EQ(p.total, 394u);
  EXPECT_EQ(p.displs, (std::vector<size_t>{0, 100, 196, 296}));
}

TEST(PlanAllGatherV, ExactSendsWhenPaddingWouldWaste) {
  AllGatherVPlan p = PlanAllGatherV({1000, 10, 0, 10});
  EXPECT_FALSE(p.padded);
  EXPECT_EQ(p.total, 1020u);
  EXPECT_EQ(p.displs, (std::vector<size_t>{0, 1000, 1010, 1010}));
  // The boundary: padding of exactly 1/8 of the padded bytes is still padded.
  EXPECT_TRUE(PlanAllGatherV({8, 8, 8, 4}).padded);   // 32 padded, 28 real: waste 4 = 1/8
  EXPECT_FALSE(PlanAllGatherV({8, 8, 8, 3}).padded);  // waste 5 > 4
  EXPECT_FALSE(PlanAllGatherV({0, 0}).padded);
  EXPECT_EQ(PlanAllGatherV({0, 0}).total, 0u);
  EXPECT_TRUE(PlanAllGatherV({5}).padded);
}

std::string FakeId(char fill) { return std::string(kNcclUniqueIdBytes, fill); }

TEST(AgreeOnNcclId, EveryRankGetsRankZerosId) {
  for (int size : {1, 2, 4}) {
    InProcessHub hub(size);
    std::atomic<int> made{0};
    std::vector<std::string> ids(size);
    RunRanks(hub, [&](Collective& c, int r) {
      absl::StatusOr<std::string> id = AgreeOnNcclId(&c, absl::OkStatus(), [&] {
        ++made;
        return absl::StatusOr<std::string>(FakeId('a' + r));
      });
      ASSERT_TRUE(id.ok()) << id.status();
      ids[r] = *id;
    });
    EXPECT_EQ(made.load(), 1) << "size " << size;
    for (int r = 0; r < size; ++r) EXPECT_EQ(ids[r], FakeId('a')) << "rank " << r;
  }
}

TEST(AgreeOnNcclId, AnUnreadyRankFailsEveryoneAndIsNamed) {
  InProcessHub hub(4, absl::Seconds(10));
  std::atomic<int> made{0};
  RunRanks(hub, [&](Collective& c, int r) {
    const absl::Status local =
        r == 2 ? absl::FailedPreconditionError("no usable GPU: cudaErrorInsufficientDriver")
               : absl::OkStatus();
    absl::StatusOr<std::string> id = AgreeOnNcclId(&c, local, [&] {
      ++made;
      return absl::StatusOr<std::string>(FakeId('x'));
    });
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string m(id.status().message());
    EXPECT_NE(m.find("rank(s) 2 of 4"), std::string::npos) << m;
    if (r == 2) {
      EXPECT_NE(m.find("cudaErrorInsufficientDriver"), std::string::npos) << m;
    }
  });
  EXPECT_EQ(made.load(), 0);
}

TEST(AgreeOnNcclId, RankZeroFailingToMakeAnIdFailsEveryone) {
  InProcessHub hub(3, absl::Seconds(10));
  RunRanks(hub, [&](Collective& c, int r) {
    absl::StatusOr<std::string> id = AgreeOnNcclId(&c, absl::OkStatus(), [] {
      return absl::StatusOr<std::string>(absl::UnavailableError("ncclGetUniqueId: system error"));
    });
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string m(id.status().message());
    if (r == 0) {
      EXPECT_NE(m.find("ncclGetUniqueId: system error"), std::string::npos) << m;
    } else {
      EXPECT_NE(m.find("rank 0 could not create"), std::string::npos) << m;
    }
  });
}

TEST(AgreeOnNcclId, WrongSizedIdIsRejected) {
  InProcessHub hub(2, absl::Seconds(10));
  RunRanks(hub, [&](Collective& c, int) {
    absl::StatusOr<std::string> id = AgreeOnNcclId(
        &c, absl::OkStatus(), [] { return absl::StatusOr<std::string>(std::string(5, 'z')); });
    EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition);
  });
}

int GpuCount() {
#ifdef SPEX_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  cudaGetLastError();
  return n;
#else
  return 0;
#endif
}

TEST(MakeNcclCollective, WithoutAGpuEveryRankFailsTogether) {
  if (GpuCount() > 0) GTEST_SKIP() << "a GPU is present; see NcclOnOneGpu";
  InProcessHub hub(2, absl::Seconds(10));
  RunRanks(hub, [&](Collective& c, int) {
    absl::StatusOr<std::unique_ptr<Collective>> nccl = MakeNcclCollective(&c, 0);
    ASSERT_FALSE(nccl.ok());
    EXPECT_EQ(nccl.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string m(nccl.status().message());
    EXPECT_NE(m.find("rank(s) 0, 1 of 2"), std::string::npos) << m;
#ifdef SPEX_HAVE_CUDA
    EXPECT_NE(m.find("cudaError"), std::string::npos) << m;
#else
    EXPECT_NE(m.find("built without CUDA"), std::string::npos) << m;
#endif
  });
}

#ifdef SPEX_HAVE_CUDA
// One rank on GPU 0: the calls, with host and device pointers.
TEST(MakeNcclCollective, NcclOnOneGpu) {
  if (GpuCount() == 0) GTEST_SKIP() << "no usable GPU on this machine (compile-only check)";
  InProcessHub hub(1);
  std::unique_ptr<Collective> boot = hub.Connect(0);
  absl::StatusOr<std::unique_ptr<Collective>> made = MakeNcclCollective(boot.get(), 0);
  ASSERT_TRUE(made.ok()) << made.status();
  Collective& nccl = **made;
  EXPECT_STREQ(nccl.name(), "nccl");
  double host[3] = {1, 2, 3};
  ASSERT_TRUE(nccl.AllReduce(host, 3, ElemType::kFloat64, ReduceOp::kMax).ok());
  EXPECT_EQ(host[2], 3);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), 4 * sizeof(float)), cudaSuccess);
  const float in[4] = {1, 2, 3, 4};
  ASSERT_EQ(cudaMemcpy(dev, in, sizeof(in), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // NCCL's stream is not the legacy one
  ASSERT_TRUE(nccl.AllReduceScaled(dev, dev, 4, 0.5f).ok());
  float out[4];
  ASSERT_EQ(cudaMemcpy(out, dev, sizeof(out), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(out[3], 2.0f);
  std::vector<size_t> counts;
  std::vector<uint8_t> all;
  ASSERT_TRUE(nccl.AllGatherV(dev, 12, &counts, &all).ok());
  ASSERT_EQ(counts, std::vector<size_t>{12});
  ASSERT_EQ(all.size(), 12u);
  float first;
  std::memcpy(&first, all.data(), 4);
  EXPECT_EQ(first, 0.5f);
  ASSERT_TRUE(nccl.Barrier().ok());
  cudaFree(dev);
}
#endif

}  // namespace
}  // namespace spex
