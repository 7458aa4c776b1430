// Collective over threads of one process: every thread is a "node". Lets unit tests run N
// daemons' engines in one process without mpirun (the role gloo's in-process fixture plays).
// A rank that does not arrive within the hub's timeout makes the others fail with
// DeadlineExceeded instead of hanging.
#pragma once

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/transport/collective.h"

namespace spex {

class InProcessHub {
 public:
  explicit InProcessHub(int size, absl::Duration timeout = absl::Seconds(30));
  int size() const { return size_; }
  // The Collective for `rank`; each rank's object must be used by one thread at a time.
  std::unique_ptr<Collective> Connect(int rank);

 private:
  friend class InProcessCollective;
  struct Slot {
    const void* data = nullptr;
    size_t bytes = 0;
  };
  // Publishes this rank's slot and waits until every rank has done so for the same round.
  absl::Status Arrive(int rank, const void* data, size_t bytes);
  // Waits until every rank has finished reading the round's slots.
  absl::Status Depart(int rank);
  absl::Status Wait(uint64_t* counter, uint64_t target);

  const int size_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<Slot> slots_;
  uint64_t arrived_ = 0;   // total arrivals over all rounds
  uint64_t departed_ = 0;  // total departures over all rounds
};

}  // namespace spex
