// A small persistent pool that runs the tasks of one parallel loop on a fixed set of threads
// (the caller included), for the CPU primitives. No work queue: one loop at a time; a caller
// that finds the pool busy runs its loop on its own thread instead of waiting.
// Idle workers spin briefly before sleeping, so back-to-back loops start without a wake-up.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace spex {

class ThreadPool {
 public:
  // `threads` participants in total: the caller plus threads - 1 workers (at least 1).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(task, worker) for every task in [0, tasks), each exactly once, and returns when all
  // have finished. `worker` is in [0, size()) and no two tasks run at once with the same worker,
  // so it can index per-thread scratch. Tasks are handed out dynamically in ascending order.
  void Run(size_t tasks, const std::function<void(size_t task, int worker)>& fn);

 private:
  void WorkerLoop(int worker);
  void Drain(int worker);

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // held by the Run in progress

  // A Run publishes fn_/tasks_/next_, then bumps generation_; each worker drains tasks once per
  // generation and bumps finished_. Sleepers are woken through mu_/cv_ (counted in sleepers_).
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> finished_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  int sleepers_ = 0;             // guarded by mu_
  bool caller_waiting_ = false;  // guarded by mu_

  const std::function<void(size_t, int)>* fn_ = nullptr;
  size_t tasks_ = 0;
  std::atomic<size_t> next_{0};
};

}  // namespace spex
