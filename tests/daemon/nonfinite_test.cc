// The non-finite gradient policy (issue 16 item 3), the parts written so far: the control
// round's nonfinite word, which tells every node which trainer of which node handed in the first
// NaN/+-Inf, so that all nodes decide alike before anything is mutated. The engine does not set
// or read the word yet; the multi-node policy tests (dense, micro, topk, both policies) are not
// written.
#include <memory>
#include <thread>
#include <vector>

#include "daemon/engine/control_round.h"
#include "daemon/transport/inproc_collective.h"
#include "gtest/gtest.h"

namespace spex {
namespace {

TEST(NonfiniteWordTest, NamesTrainerNodeAndIndex) {
  EXPECT_EQ(NonfiniteName(NonfiniteWord(3, 1, 4000000000u)),
            "local trainer 1 of node 3, first non-finite value at index 4000000000");
  EXPECT_NE(NonfiniteWord(0, 0, 0), 0u);  // node 0, trainer 0, index 0 is still "seen"
}

// Three in-process nodes; node 1 saw a NaN at index 7 from its trainer 2, node 2 one at index 5
// from its trainer 0, node 0 none: every node gets the same word (the highest node's).
TEST(NonfiniteWordTest, EveryNodeGetsTheSameWord) {
  constexpr int kNodes = 3;
  InProcessHub hub(kNodes);
  std::vector<Control> got(kNodes);
  std::vector<absl::Status> status(kNodes);
  std::vector<std::thread> threads;
  for (int r = 0; r < kNodes; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Collective> coll = hub.Connect(r);
      const ExchangeKey key{1, 2, 100, "micro"};
      got[r].nonfinite = r == 1 ? NonfiniteWord(1, 2, 7) : r == 2 ? NonfiniteWord(2, 0, 5) : 0;
      status[r] = RunControlRound(coll.get(), key, &got[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kNodes; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(got[r].nonfinite, NonfiniteWord(2, 0, 5)) << "node " << r;
  }
}

TEST(NonfiniteWordTest, ZeroWhenNoNodeSawOne) {
  constexpr int kNodes = 2;
  InProcessHub hub(kNodes);
  std::vector<Control> got(kNodes);
  std::vector<std::thread> threads;
  for (int r = 0; r < kNodes; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Collective> coll = hub.Connect(r);
      EXPECT_TRUE(RunControlRound(coll.get(), ExchangeKey{1, 2, 100, "dense"}, &got[r]).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Control& c : got) EXPECT_EQ(c.nonfinite, 0u);
}

}  // namespace
}  // namespace spex
