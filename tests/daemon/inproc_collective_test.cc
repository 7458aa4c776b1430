#include "daemon/transport/inproc_collective.h"

#include <thread>

#include "gtest/gtest.h"

namespace spex {
namespace {

template <typename Fn>
void RunRanks(InProcessHub& hub, Fn fn) {
  std::vector<std::thread> t;
  for (int r = 0; r < hub.size(); ++r)
    t.emplace_back([&, r] {
      auto c = hub.Connect(r);
      fn(*c, r);
    });
  for (auto& x : t) x.join();
}

TEST(InProcessCollective, AllReduceAllGatherVBroadcast) {
  InProcessHub hub(4);
  RunRanks(hub, [](Collective& c, int r) {
    for (int round = 0; round < 50; ++round) {
      double v[2] = {static_cast<double>(r), static_cast<double>(-r)};
      ASSERT_TRUE(c.AllReduce(v, 2, ElemType::kFloat64, ReduceOp::kSum).ok());
      EXPECT_EQ(v[0], 6);
      EXPECT_EQ(v[1], -6);
      std::vector<float> x(10, static_cast<float>(r + 1)), y(10);
      ASSERT_TRUE(c.AllReduceScaled(x.data(), y.data(), 10, 0.25f).ok());
      EXPECT_EQ(y[9], 2.5f);
      std::vector<uint8_t> mine(r, static_cast<uint8_t>(r)), all;
      std::vector<size_t> counts;
      ASSERT_TRUE(c.AllGatherV(mine.data(), mine.size(), &counts, &all).ok());
      ASSERT_EQ(all.size(), 6u);
      EXPECT_EQ(counts[3], 3u);
      EXPECT_EQ(all[5], 3);
      int b = r == 2 ? 42 + round : 0;
      ASSERT_TRUE(c.Broadcast(&b, sizeof(b), 2).ok());
      EXPECT_EQ(b, 42 + round);
    }
  });
}

TEST(InProcessCollective, MissingPeerIsADeadlineNotAHang) {
  InProcessHub hub(2, absl::Milliseconds(200));
  auto c = hub.Connect(0);
  EXPECT_EQ(c->Barrier().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(InProcessCollective, SizeMismatchIsAnError) {
  InProcessHub hub(2);
  RunRanks(hub, [](Collective& c, int r) {
    std::vector<float> x(r + 1);
    EXPECT_EQ(c.AllReduce(x.data(), x.size(), ElemType::kFloat32, ReduceOp::kSum).code(),
              absl::StatusCode::kInvalidArgument);
  });
}

}  // namespace
}  // namespace spex
