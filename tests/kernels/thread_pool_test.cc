// The CPU primitives' thread pool: every task runs exactly once, worker ids are private while a
// task runs, back-to-back loops (spinning and sleeping workers) never lose a wake-up, and a
// second caller during a loop runs its own loop inline.
#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace spex {
namespace {

TEST(ThreadPoolTest, EveryTaskRunsOnceWithAPrivateWorkerId) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    ASSERT_EQ(pool.size(), threads);
    for (size_t tasks : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}}) {
      std::vector<std::atomic<int>> runs(tasks);
      std::vector<std::atomic<int>> busy(threads);
      std::atomic<bool> clash{false}, bad_worker{false};
      pool.Run(tasks, [&](size_t t, int w) {
        if (w < 0 || w >= threads) {
          bad_worker = true;
          return;
        }
        if (busy[w].fetch_add(1) != 0) clash = true;
        runs[t].fetch_add(1);
        busy[w].fetch_sub(1);
      });
      EXPECT_FALSE(bad_worker);
      EXPECT_FALSE(clash);
      for (size_t t = 0; t < tasks; ++t) EXPECT_EQ(runs[t].load(), 1) << "task " << t;
    }
  }
}

TEST(ThreadPoolTest, ManyLoopsBackToBackAndAfterIdling) {
  ThreadPool pool(2);
  std::atomic<uint64_t> sum{0};
  for (int round = 0; round < 20000; ++round) {
    pool.Run(4, [&](size_t t, int) { sum.fetch_add(t + 1); });
    if (round % 5000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // sleepers
  }
  EXPECT_EQ(sum.load(), 20000u * 10u);
}

TEST(ThreadPoolTest, BusyPoolRunsASecondCallerInline) {
  ThreadPool pool(2);
  std::atomic<bool> release{false}, started{false};
  std::thread first([&] {
    pool.Run(2, [&](size_t, int) {
      started = true;
      while (!release) std::this_thread::yield();
    });
  });
  while (!started) std::this_thread::yield();
  std::vector<int> workers;
  pool.Run(3, [&](size_t, int w) { workers.push_back(w); });  // inline: no data race on the vector
  EXPECT_EQ(workers, std::vector<int>({0, 0, 0}));
  release = true;
  first.join();
}

}  // namespace
}  // namespace spex
