// The persistent thread pool of the CPU primitives (thread_pool.h).
#include "kernels/cpu/thread_pool.h"

#include <chrono>

namespace spex {
namespace {

constexpr auto kSpin = std::chrono::microseconds(50);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until done() or kSpin has passed; returns done().
template <class Done>
bool SpinUntil(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    CpuRelax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { WorkerLoop(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Drain(int worker) {
  for (size_t t = next_.fetch_add(1); t < tasks_; t = next_.fetch_add(1)) (*fn_)(t, worker);
}

void ThreadPool::WorkerLoop(int worker) {
  uint64_t seen = 0;
  while (true) {
    auto ready = [&] {
      return stop_.load() || generation_.load(std::memory_order_acquire) != seen;
    };
    if (!SpinUntil(ready)) {
      std::unique_lock<std::mutex> lock(mu_);
      ++sleepers_;
      cv_.wait(lock, ready);
      --sleepers_;
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    Drain(worker);
    if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 ==
        static_cast<int>(workers_.size())) {
      std::lock_guard<std::mutex> lock(mu_);
      if (caller_waiting_) cv_.notify_all();
    }
  }
}

void ThreadPool::Run(size_t tasks, const std::function<void(size_t, int)>& fn) {
  std::unique_lock<std::mutex> run_lock(run_mu_, std::try_to_lock);
  if (tasks <= 1 || workers_.empty() || !run_lock.owns_lock()) {
    for (size_t t = 0; t < tasks; ++t) fn(t, 0);
    return;
  }
  fn_ = &fn;
  tasks_ = tasks;
  next_.store(0);
  finished_.store(0);
  generation_.fetch_add(1, std::memory_order_acq_rel);  // publishes the fields above
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sleepers_ > 0) cv_.notify_all();
  }
  Drain(0);
  const int workers = static_cast<int>(workers_.size());
  auto done = [&] { return finished_.load(std::memory_order_acquire) == workers; };
  if (!SpinUntil(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    caller_waiting_ = true;
    cv_.wait(lock, done);
    caller_waiting_ = false;
  }
  fn_ = nullptr;
}

}  // namespace spex
