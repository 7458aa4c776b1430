// What the engine tells observers (metrics, the timeline) about every exchange it publishes.
// Called on the engine thread right after the trainers were woken, so an observer must be quick
// and do its own locking against readers on other threads. With no observer the engine does no
// extra work.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "daemon/engine/exchange_record.h"

namespace spex {

// One phase of one exchange, in MonotonicNanos (proto/contract/futex.h) time.
struct PhaseSpan {
  Phase phase;
  uint64_t begin_ns = 0;
  uint64_t end_ns = 0;
};

struct ExchangeEvent {
  const ExchangeRecord* record = nullptr;  // valid during the call only
  absl::StatusCode code = absl::StatusCode::kOk;
  bool terminal = false;  // the bucket is failed from this step on
  uint64_t elements = 0;  // the bucket's size
  uint64_t begin_ns = 0;  // the exchange's start and end (publish done)
  uint64_t end_ns = 0;
  // The merge group this exchange ran in (--merger): its first bucket and its size (the bucket
  // itself and 1 when exchanged alone).
  uint64_t group_first = 0;
  uint32_t group_size = 1;
  std::vector<PhaseSpan> spans;  // in order; a phase may appear more than once
};

// A merge group that has waited EngineOptions::slow_group_warning for members while its others
// were ready (the engine logs a WARNING too).
struct SlowGroupEvent {
  uint64_t head = 0;              // the group's first bucket
  uint64_t step = 0;              // and its step
  uint64_t waited_ns = 0;         // how long the group has waited so far
  std::vector<uint64_t> missing;  // the members not ready yet
};

class ExchangeObserver {
 public:
  virtual ~ExchangeObserver() = default;
  virtual void OnExchange(const ExchangeEvent& event) = 0;
  virtual void OnSlowGroup(const SlowGroupEvent& event) {}
};

}  // namespace spex
