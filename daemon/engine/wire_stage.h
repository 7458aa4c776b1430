// The wire stage (--merge_overlap) as its own object: one thread that runs the jobs the engine
// thread hands it, one at a time and in the order handed, while the engine thread prepares the
// next; its own mutex and condition variable. It knows nothing of buckets, packs or collectives:
// the engine gives it a runner (Engine::RunPack: a pack's collectives, commit vote, publishing)
// and a completion callback (the engine's published signal and doorbell ring). Engine is its one
// user (docs/design.md#engine); tests/daemon:wire_stage_test tests it alone.
//
// Its interface to the engine: Submit (waits while a job is on the wire, then hands this one
// over), Busy (a job handed and not yet done; an atomic, read under the engine's own mutex),
// WaitIdle (until nothing is on the wire), last_done_ns (when the last job finished), Stop (the
// job handed, if any, still runs and completes; then the thread ends). For every job, in order:
// runner(job) on the wire thread, the job destroyed, Busy cleared and last_done_ns set, then
// on_done(runner's status), still on the wire thread and outside the stage's lock. So whoever sees
// the callback's signal sees Busy() false, and WaitIdle may return before the callback has run.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace spex {

// What travels to the wire thread; the runner knows its concrete type (Engine::WirePack).
struct WireJob {
  virtual ~WireJob() = default;
};

class WireStage {
 public:
  using Runner = std::function<absl::Status(WireJob*)>;
  using Done = std::function<void(const absl::Status&)>;

  WireStage(Runner run, Done on_done);
  ~WireStage();  // Stop()
  WireStage(const WireStage&) = delete;
  WireStage& operator=(const WireStage&) = delete;

  // Starts the wire thread (once; before the first Submit).
  void Start();
  bool started() const { return thread_.joinable(); }
  // Waits until no job is on the wire, then hands `job` to the wire thread (one at a time).
  // One thread submits (the engine's).
  void Submit(std::unique_ptr<WireJob> job);
  // A job handed and not yet done (runner returned, job destroyed).
  bool Busy() const { return busy_.load(std::memory_order_acquire); }
  // Blocks until no job is on the wire (its callback may still be running).
  void WaitIdle();
  // MonotonicNanos() when the last job finished (0 before the first); set before Busy() clears.
  int64_t last_done_ns() const { return last_done_ns_.load(std::memory_order_acquire); }
  // Asks the thread to stop and joins it: a job handed (taken or not) runs and completes first.
  // Idempotent; a no-op when never started.
  void Stop();

 private:
  void Loop();

  const Runner run_;
  const Done on_done_;
  absl::Mutex mu_;
  absl::CondVar cv_;  // with mu_: the slot filled, a job done, the stop
  std::unique_ptr<WireJob> slot_ ABSL_GUARDED_BY(mu_);  // handed, not yet taken
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> busy_{false};  // written under mu_
  std::atomic<int64_t> last_done_ns_{0};
  std::thread thread_;
};

}  // namespace spex
