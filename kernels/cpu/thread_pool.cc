#include "kernels/cpu/thread_pool.h"

namespace spex {

ThreadPool::ThreadPool(int threads) {
  for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { WorkerLoop(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Drain(int worker) {
  for (size_t t = next_.fetch_add(1); t < tasks_; t = next_.fetch_add(1)) (*fn_)(t, worker);
}

void ThreadPool::WorkerLoop(int worker) {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    Drain(worker);
    bool last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = ++finished_ == static_cast<int>(workers_.size());
    }
    if (last) done_cv_.notify_one();
  }
}

void ThreadPool::Run(size_t tasks, const std::function<void(size_t, int)>& fn) {
  std::unique_lock<std::mutex> run_lock(run_mu_, std::try_to_lock);
  if (tasks <= 1 || workers_.empty() || !run_lock.owns_lock()) {
    for (size_t t = 0; t < tasks; ++t) fn(t, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    tasks_ = tasks;
    next_.store(0);
    finished_ = 0;
    ++generation_;
  }
  wake_cv_.notify_all();
  Drain(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return finished_ == static_cast<int>(workers_.size()); });
  fn_ = nullptr;
}

}  // namespace spex
