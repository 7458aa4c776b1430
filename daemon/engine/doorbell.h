// The node's doorbell: a small shared segment every local trainer maps, whose ring counter the
// engine sleeps on (futex) and trainers bump when they mark a bucket's input ready, so the hot
// path needs no RPC. A segment is unlinked once every local trainer attached it; a trainer that
// arrives later (a new job) gets a new generation. Ring() and segment() are safe from any
// thread; the rest is called under the engine's mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/memory/shm_buffer.h"
#include "proto/contract/layout.h"

namespace spex {

class Doorbell {
 public:
  explicit Doorbell(std::string shm_tag) : shm_tag_(std::move(shm_tag)) {}

  // A new segment becomes current; an engine sleeping on the old one is woken.
  absl::Status NewGeneration();
  // The segment a trainer of `local_rank` maps: the current one, or a new generation when the
  // current one is unlinked or that rank already attached it.
  absl::StatusOr<const ShmBuffer*> ForTrainer(uint32_t local_rank);
  DoorbellSegment* segment() const { return current_.load(); }
  // Wakes the engine (a registration or an RPC changed what it can do).
  void Ring();
  // Marks every generation shut down and wakes everyone sleeping on one.
  void ShutdownAll();
  void UnlinkIfAllAttached(int local_trainers);
  // Frees the generations before the newest two that are unlinked (every local trainer attached
  // them, so nobody needs the name) and that the engine thread is not waiting on (`in_use`).
  // Without it every job kept its generation mapped for the daemon's life (4 KiB and a mapping
  // each). A trainer keeps its own mapping of a freed one; only the shutdown flag no longer
  // reaches a trainer still on it (one that outlived two newer generations).
  void DropOld(const DoorbellSegment* in_use);
  std::vector<std::string> LinkedSegments() const;

 private:
  const std::string shm_tag_;
  std::vector<std::unique_ptr<ShmBuffer>> generations_;  // newest last
  std::atomic<DoorbellSegment*> current_{nullptr};
};

}  // namespace spex
