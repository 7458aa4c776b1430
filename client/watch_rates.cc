// What `spexctl watch` prints per bucket (watch_rates.h): rates from the deltas of two GetStats
// answers, kept apart from spexctl so the arithmetic is unit-tested.
#include "client/watch_rates.h"

namespace spex {

std::map<uint64_t, BucketRates> WatchRates::Update(const v1::GetStatsResponse& now,
                                                   double seconds) {
  std::map<uint64_t, BucketRates> rates;
  std::map<uint64_t, Counts> current;
  for (const v1::BucketStats& b : now.buckets()) {
    const bool totals = b.has_bytes_sent_total() && b.has_bytes_received_total();
    const Counts c = {b.exchanges(), b.bytes_sent_total(), b.bytes_received_total()};
    current[b.bucket_id()] = c;
    BucketRates& r = rates[b.bucket_id()];
    if (!have_previous_ || !(seconds > 0)) continue;
    Counts before;  // zeros: a bucket registered since the previous answer
    auto it = previous_.find(b.bucket_id());
    if (it != previous_.end() && it->second.exchanges <= c.exchanges && it->second.sent <= c.sent &&
        it->second.received <= c.received) {
      before = it->second;
    }
    r.exchanges = (c.exchanges - before.exchanges) / seconds;
    if (totals) {
      r.bytes_sent = (c.sent - before.sent) / seconds;
      r.bytes_received = (c.received - before.received) / seconds;
    }
  }
  previous_.swap(current);
  have_previous_ = true;
  return rates;
}

}  // namespace spex
