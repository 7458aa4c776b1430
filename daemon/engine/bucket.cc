// EngineBucket's state machine (MoveTo), its counters, ready stamps and summaries (bucket.h).
#include "daemon/engine/bucket.h"

#include <algorithm>

#include "daemon/util/log.h"

namespace spex {

const char* BucketStateName(BucketState s) {
  switch (s) {
    case BucketState::kRegistering:
      return "registering";
    case BucketState::kWaiting:
      return "waiting";
    case BucketState::kExchanging:
      return "exchanging";
    case BucketState::kFailed:
      return "failed";
  }
  return "?";
}

bool IsLegalTransition(BucketState from, BucketState to) {
  switch (from) {
    case BucketState::kRegistering:
      return to == BucketState::kWaiting;
    case BucketState::kWaiting:
      return to == BucketState::kRegistering || to == BucketState::kExchanging;
    case BucketState::kExchanging:
      return to == BucketState::kWaiting || to == BucketState::kRegistering ||
             to == BucketState::kFailed;
    case BucketState::kFailed:
      return false;
  }
  return false;
}

bool EngineBucket::MoveTo(BucketState to) {
  if (out.state == to) return true;
  if (!IsLegalTransition(out.state, to)) {
    SPEX_LOG(ERROR) << "bucket " << id << ": illegal state change " << BucketStateName(out.state)
                    << " -> " << BucketStateName(to) << " (a bug; please report it)";
    return false;
  }
  out.state = to;
  return true;
}

void BucketOutcome::Count(const ExchangeRecord& rec) {
  last = rec;
  exchanges++;
  bytes_sent_total += rec.bytes_sent;
  bytes_received_total += rec.bytes_received;
  for (int p = 0; p < kPhaseCount; ++p) {
    phase_sum[p] += rec.phase_seconds[p];
    phase_cpu_sum[p] += rec.phase_cpu_seconds[p];
  }
}

int64_t EngineBucket::ReadyStamp(int local_trainers) const {
  int64_t ready = 0;
  for (int r = 0; r < local_trainers; ++r) {
    ready = std::max<int64_t>(
        ready, static_cast<int64_t>(mem.header->ready[r].ready_ns.load(std::memory_order_relaxed)));
  }
  return ready;
}

BucketSummary EngineBucket::Summary() const {
  BucketSummary s;
  s.bucket_id = id;
  s.elements = elements;
  s.compressor = compressor;
  s.dtype = DTypeName(policy.dtype);
  s.state = BucketStateName(out.state);
  s.exchanges = out.exchanges;
  s.bytes_sent_total = out.bytes_sent_total;
  s.bytes_received_total = out.bytes_received_total;
  s.last = out.last;
  s.exchange_choice = out.exchange_choice;
  for (int p = 0; p < kPhaseCount; ++p) {
    s.mean_phase_seconds[p] = out.exchanges ? out.phase_sum[p] / out.exchanges : 0;
    s.mean_phase_cpu_seconds[p] = out.exchanges ? out.phase_cpu_sum[p] / out.exchanges : 0;
  }
  return s;
}

}  // namespace spex
