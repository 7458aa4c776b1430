// The node's doorbell segments (doorbell.h): creation per generation, the trainers' mappings,
// unlinking once every local trainer attached, ringing and shutdown.
#include "daemon/engine/doorbell.h"

#include <algorithm>

#include "proto/contract/futex.h"

namespace spex {

absl::Status Doorbell::NewGeneration() {
  auto shm = ShmBuffer::Create(kPageBytes, shm_tag_ + "-bell");
  if (!shm.ok()) return shm.status();
  auto* seg = new ((*shm)->data()) DoorbellSegment();
  seg->magic = kDoorbellMagic;
  seg->version = kLayoutVersion;
  generations_.push_back(std::move(*shm));
  DoorbellSegment* old = current_.exchange(seg);
  if (old != nullptr) {
    // Wake the engine so it starts waiting on the new segment.
    old->ring.fetch_add(1);
    FutexWake(&old->ring);
  }
  return absl::OkStatus();
}

absl::StatusOr<const ShmBuffer*> Doorbell::ForTrainer(uint32_t local_rank) {
  if (generations_.empty() || generations_.back()->unlinked() ||
      segment()->attached[local_rank].load()) {
    if (absl::Status s = NewGeneration(); !s.ok()) return s;
  }
  return generations_.back().get();
}

void Doorbell::Ring() {
  DoorbellSegment* bell = segment();
  if (bell == nullptr) return;
  bell->ring.fetch_add(1);
  if (bell->engine_sleeping.load()) FutexWake(&bell->ring);
}

void Doorbell::ShutdownAll() {
  for (auto& shm : generations_) {
    auto* seg = static_cast<DoorbellSegment*>(shm->data());
    seg->shutdown.store(1);
    seg->ring.fetch_add(1);
    FutexWake(&seg->ring);
  }
}

void Doorbell::UnlinkIfAllAttached(int local_trainers) {
  if (generations_.empty()) return;
  ShmBuffer* bell = generations_.back().get();
  if (bell->unlinked()) return;
  auto* seg = static_cast<DoorbellSegment*>(bell->data());
  for (int r = 0; r < local_trainers; ++r) {
    if (seg->attached[r].load() == 0) return;
  }
  bell->Unlink().IgnoreError();
}

void Doorbell::DropOld(const DoorbellSegment* in_use) {
  if (generations_.size() <= 2) return;
  const auto end = generations_.end() - 2;
  generations_.erase(std::remove_if(generations_.begin(), end,
                                    [&](const std::unique_ptr<ShmBuffer>& g) {
                                      return g->unlinked() && g->data() != in_use;
                                    }),
                     end);
}

std::vector<std::string> Doorbell::LinkedSegments() const {
  std::vector<std::string> out;
  for (const auto& bell : generations_) {
    if (!bell->unlinked()) out.push_back(bell->name());
  }
  return out;
}

}  // namespace spex
