// The wire stage's thread and hand-off (wire_stage.h): one slot, one job on the wire at a time.
#include "daemon/engine/wire_stage.h"

#include <utility>

#include "daemon/util/log.h"
#include "proto/contract/futex.h"

namespace spex {

WireStage::WireStage(Runner run, Done on_done)
    : run_(std::move(run)), on_done_(std::move(on_done)) {}

WireStage::~WireStage() { Stop(); }

void WireStage::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void WireStage::Submit(std::unique_ptr<WireJob> job) {
  absl::MutexLock lock(&mu_);
  while (busy_.load(std::memory_order_relaxed)) cv_.Wait(&mu_);  // one job on the wire at a time
  slot_ = std::move(job);
  busy_.store(true, std::memory_order_release);
  cv_.SignalAll();
}

void WireStage::WaitIdle() {
  absl::MutexLock lock(&mu_);
  while (busy_.load(std::memory_order_relaxed)) cv_.Wait(&mu_);
}

void WireStage::Stop() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  thread_.join();
}

void WireStage::Loop() {
  SPEX_LOG(DEBUG) << "wire thread started";
  while (true) {
    std::unique_ptr<WireJob> job;
    {
      absl::MutexLock lock(&mu_);
      while (slot_ == nullptr && !stop_) cv_.Wait(&mu_);
      if (slot_ == nullptr) break;  // stopping, nothing left
      job = std::move(slot_);
    }
    const absl::Status status = run_(job.get());
    job.reset();
    {
      absl::MutexLock lock(&mu_);
      last_done_ns_.store(static_cast<int64_t>(MonotonicNanos()), std::memory_order_release);
      busy_.store(false, std::memory_order_release);
      cv_.SignalAll();
    }
    on_done_(status);  // after Busy() cleared: the engine's published signal and doorbell ring
  }
  SPEX_LOG(DEBUG) << "wire thread stopped";
}

}  // namespace spex
