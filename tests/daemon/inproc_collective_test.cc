// The in-process collective: the conformance suite (tests/support/collective_conformance.h) for 2
// to 8 ranks as threads, plus what only this backend promises (a missing rank is a deadline, a
// size mismatch an error on every rank).
#include "daemon/transport/inproc_collective.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/collective_conformance.h"

namespace spex::test {
namespace {

INSTANTIATE_TEST_SUITE_P(InProcess, CollectiveConformance,
                         ::testing::Combine(::testing::ValuesIn(InProcessWorlds(2, 8)),
                                            ::testing::ValuesIn(ConformanceSizes())),
                         ConformanceName);

TEST(InProcessCollective, MissingPeerIsADeadlineNotAHang) {
  InProcessHub hub(2, absl::Milliseconds(200));
  auto c = hub.Connect(0);
  EXPECT_EQ(c->Barrier().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(InProcessCollective, SizeMismatchIsAnError) {
  Spawn(2, [](Collective* c) {
    std::vector<float> x(c->rank() + 1);
    EXPECT_EQ(c->AllReduce(x.data(), x.size(), ElemType::kFloat32, ReduceOp::kSum).code(),
              absl::StatusCode::kInvalidArgument);
  });
}

// Spawn itself: every rank runs once, with its own rank, and Spawn returns after all of them.
TEST(Spawn, RunsEveryRankOnceOverOneHub) {
  for (int ranks : {1, 3, 8}) {
    std::vector<std::atomic<int>> seen(ranks);
    Spawn(ranks, [&](Collective* c) {
      EXPECT_EQ(c->size(), ranks);
      ++seen[c->rank()];
      EXPECT_TRUE(c->Barrier().ok());
    });
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(seen[r].load(), 1) << "rank " << r;
  }
}

}  // namespace
}  // namespace spex::test
