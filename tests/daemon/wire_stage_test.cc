// The engine's wire stage (daemon/engine/wire_stage.h) on its own, without an engine: jobs run on
// its thread one at a time in the order submitted, Busy() while one is in flight, the completion
// callback after Busy() clears with the runner's status (an exchange's error reaching the
// engine), and Stop() with a job in flight finishing it first. Tagged for TSan.
#include "daemon/engine/wire_stage.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "proto/contract/futex.h"

namespace spex {
namespace {

struct TestJob : WireJob {
  TestJob(int id, std::atomic<int>* destroyed) : id(id), destroyed(destroyed) {}
  ~TestJob() override { destroyed->fetch_add(1); }
  int id;
  std::atomic<int>* destroyed;
};

// A stage whose runner and callback record what happened; `gate(id)` (when set) is waited on by
// the runner of job `id` before it returns, `result(id)` is what it returns.
class Recorder {
 public:
  Recorder()
      : stage_([this](WireJob* j) { return Run(static_cast<TestJob*>(j)); },
               [this](const absl::Status& s) { Done(s); }) {}

  WireStage& stage() { return stage_; }
  std::unique_ptr<WireJob> Job(int id) { return std::make_unique<TestJob>(id, &destroyed_); }
  void Gate(int id, absl::Notification* n) {
    absl::MutexLock lock(&mu_);
    gates_.resize(id + 1, nullptr);
    gates_[id] = n;
  }
  void Fail(int id, absl::Status s) {
    absl::MutexLock lock(&mu_);
    results_.resize(id + 1);
    results_[id] = std::move(s);
  }
  // Blocks until the runner of job `id` has started; false after 10 s (a broken stage fails
  // rather than hangs).
  bool AwaitStarted(int id) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    absl::MutexLock lock(&mu_);
    auto started = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (int r : ran_) {
        if (r == id) return true;
      }
      return false;
    };
    while (!started()) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) return started();
    }
    return true;
  }
  // Blocks until `n` callbacks ran; false after 10 s.
  bool AwaitDone(size_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    absl::MutexLock lock(&mu_);
    while (done_.size() < n) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) return done_.size() >= n;
    }
    return true;
  }
  std::vector<int> ran() {
    absl::MutexLock lock(&mu_);
    return ran_;
  }
  std::vector<absl::Status> done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  int destroyed() const { return destroyed_.load(); }
  int max_concurrent() const { return max_concurrent_.load(); }
  bool busy_seen_in_callback() const { return busy_in_callback_.load(); }
  bool previous_destroyed_before_next() const { return destroyed_in_order_.load(); }
  std::thread::id runner_thread() {
    absl::MutexLock lock(&mu_);
    return runner_thread_;
  }

 private:
  absl::Status Run(TestJob* job) {
    const int now = concurrent_.fetch_add(1) + 1;
    if (now > max_concurrent_.load()) max_concurrent_.store(now);
    if (destroyed_.load() != static_cast<int>(ran().size())) destroyed_in_order_.store(false);
    absl::Notification* gate = nullptr;
    absl::Status result;
    {
      absl::MutexLock lock(&mu_);
      ran_.push_back(job->id);
      runner_thread_ = std::this_thread::get_id();
      if (job->id < static_cast<int>(gates_.size())) gate = gates_[job->id];
      if (job->id < static_cast<int>(results_.size())) result = results_[job->id];
      cv_.SignalAll();
    }
    if (gate != nullptr) gate->WaitForNotification();
    concurrent_.fetch_sub(1);
    return result;
  }
  void Done(const absl::Status& s) {
    if (stage_.Busy()) busy_in_callback_.store(true);
    absl::MutexLock lock(&mu_);
    done_.push_back(s);
    cv_.SignalAll();
  }

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<absl::Notification*> gates_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  std::vector<int> ran_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> done_ ABSL_GUARDED_BY(mu_);
  std::thread::id runner_thread_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> destroyed_{0};
  std::atomic<int> concurrent_{0};
  std::atomic<int> max_concurrent_{0};
  std::atomic<bool> busy_in_callback_{false};
  std::atomic<bool> destroyed_in_order_{true};
  WireStage stage_;  // last: stopped (joined) before the rest goes
};

TEST(WireStageTest, SubmitRunsTheJobOnTheWireThreadThenCallsBack) {
  Recorder r;
  r.stage().Start();
  EXPECT_FALSE(r.stage().Busy());
  EXPECT_EQ(r.stage().last_done_ns(), 0);
  const int64_t before = static_cast<int64_t>(MonotonicNanos());
  r.stage().Submit(r.Job(7));
  ASSERT_TRUE(r.AwaitDone(1));
  r.stage().WaitIdle();
  EXPECT_FALSE(r.stage().Busy());
  EXPECT_EQ(r.ran(), std::vector<int>{7});
  EXPECT_NE(r.runner_thread(), std::this_thread::get_id());
  ASSERT_EQ(r.done().size(), 1u);
  EXPECT_TRUE(r.done()[0].ok());
  EXPECT_EQ(r.destroyed(), 1);
  EXPECT_GE(r.stage().last_done_ns(), before);
  EXPECT_FALSE(r.busy_seen_in_callback());  // the callback fires after Busy() cleared
  r.stage().Stop();
}

TEST(WireStageTest, BusyWhileInFlightAndWaitIdleWaitsForTheJob) {
  Recorder r;
  absl::Notification gate;
  r.Gate(0, &gate);
  r.stage().Start();
  r.stage().Submit(r.Job(0));
  ASSERT_TRUE(r.AwaitStarted(0));
  EXPECT_TRUE(r.stage().Busy());
  std::atomic<bool> idle{false};
  std::thread waiter([&] {
    r.stage().WaitIdle();
    idle.store(true);
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(idle.load());  // the job is still on the wire
  EXPECT_TRUE(r.stage().Busy());
  EXPECT_TRUE(r.done().empty());
  gate.Notify();
  waiter.join();
  EXPECT_TRUE(idle.load());
  EXPECT_FALSE(r.stage().Busy());
  ASSERT_TRUE(r.AwaitDone(1));
  r.stage().Stop();
}

TEST(WireStageTest, JobsRunOneAtATimeAndCompleteInSubmitOrder) {
  Recorder r;
  absl::Notification gate;
  r.Gate(0, &gate);  // the first job holds the wire while the next is submitted
  r.stage().Start();
  r.stage().Submit(r.Job(0));
  ASSERT_TRUE(r.AwaitStarted(0));
  std::atomic<bool> submitted{false};
  std::thread engine([&] {
    r.stage().Submit(r.Job(1));  // waits for job 0
    submitted.store(true);
    for (int id = 2; id < 8; ++id) r.stage().Submit(r.Job(id));
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(submitted.load());  // one job on the wire at a time
  EXPECT_EQ(r.ran(), std::vector<int>{0});
  gate.Notify();
  engine.join();
  r.stage().WaitIdle();
  ASSERT_TRUE(r.AwaitDone(8));
  EXPECT_EQ(r.ran(), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(r.done().size(), 8u);
  EXPECT_EQ(r.max_concurrent(), 1);
  EXPECT_TRUE(r.previous_destroyed_before_next());
  EXPECT_EQ(r.destroyed(), 8);
  r.stage().Stop();
}

TEST(WireStageTest, AnErrorFromTheExchangeReachesTheCallbackAndTheStageGoesOn) {
  Recorder r;
  r.Fail(1, absl::AbortedError("commit vote: node 1's step failed"));
  r.stage().Start();
  for (int id = 0; id < 3; ++id) r.stage().Submit(r.Job(id));
  ASSERT_TRUE(r.AwaitDone(3));
  const std::vector<absl::Status> done = r.done();
  ASSERT_EQ(done.size(), 3u);
  EXPECT_TRUE(done[0].ok());
  EXPECT_EQ(done[1].code(), absl::StatusCode::kAborted);
  EXPECT_EQ(done[1].message(), "commit vote: node 1's step failed");
  EXPECT_TRUE(done[2].ok());
  r.stage().Stop();
}

TEST(WireStageTest, StopWithAJobInFlightFinishesItFirst) {
  Recorder r;
  absl::Notification gate;
  r.Gate(0, &gate);
  r.stage().Start();
  r.stage().Submit(r.Job(0));
  ASSERT_TRUE(r.AwaitStarted(0));
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    r.stage().Stop();
    stopped.store(true);
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(stopped.load());  // Stop waits for the job on the wire
  gate.Notify();
  stopper.join();
  EXPECT_FALSE(r.stage().started());
  ASSERT_EQ(r.done().size(), 1u);  // its callback ran before Stop returned
  EXPECT_EQ(r.destroyed(), 1);
  r.stage().Stop();  // again: a no-op
}

TEST(WireStageTest, StopRightAfterSubmitStillRunsTheHandedJob) {
  for (int round = 0; round < 20; ++round) {
    Recorder r;
    r.stage().Start();
    r.stage().Submit(r.Job(round));  // perhaps not yet taken by the wire thread
    r.stage().Stop();
    EXPECT_EQ(r.ran(), std::vector<int>{round});
    EXPECT_EQ(r.done().size(), 1u);
    EXPECT_EQ(r.destroyed(), 1);
    EXPECT_FALSE(r.stage().Busy());
  }
}

TEST(WireStageTest, StopWithoutStartIsANoOp) {
  Recorder r;
  EXPECT_FALSE(r.stage().started());
  r.stage().Stop();
  EXPECT_TRUE(r.done().empty());
}

}  // namespace
}  // namespace spex
