// What `spexctl watch` prints per bucket (watch_rates.h): rates from the deltas of two GetStats
// answers, kept apart from spexctl so the arithmetic is unit-tested.
#include "client/watch_rates.h"

#include "absl/strings/str_format.h"

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

std::string HumanRate(double v) {
  if (v < 0) return "-";
  const char* units = " KMGTP";
  int u = 0;
  while (v >= 999.5 && u < 5) {
    v /= 1000;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f", v) : absl::StrFormat("%.1f%c", v, units[u]);
}

std::string WatchHeader() {
  return absl::StrFormat("%8s %-12s %-8s %-11s %3s %8s %9s %9s %8s %8s  %s\n", "bucket",
                         "compressor", "type", "state", "pat", "exch/s", "target", "achieved",
                         "sent/s", "recv/s", "last exchange's phases (ms)");
}

std::string WatchRow(const v1::BucketStats& b, const BucketRates& r) {
  std::string phases;
  for (const auto& p : b.last().phases()) {
    if (p.seconds() > 0) phases += absl::StrFormat(" %s=%.3f", p.phase(), p.seconds() * 1e3);
  }
  return absl::StrFormat(
      "%8u %-12s %-8s %-11s %3s %8s %9.4g %9.4g %8s %8s %s\n", b.bucket_id(), b.compressor(),
      b.dtype().empty() ? "float32" : b.dtype(), b.state().empty() ? "-" : b.state(),
      b.exchanges() ? b.last().pattern() : "-", HumanRate(r.exchanges), b.last().target_density(),
      b.last().achieved_density(), HumanRate(r.bytes_sent), HumanRate(r.bytes_received), phases);
}

}  // namespace spex
