// The rates `spexctl watch` shows per bucket, from two GetStats answers: deltas of the daemon's
// running counts (exchanges, bytes sent and received since the bucket was registered) over the
// time between the answers, so they are right whatever number of exchanges (none included)
// happened in between.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "proto/spex.pb.h"

namespace spex {

struct BucketRates {
  // Per second; negative when unknown: no earlier answer, or (bytes) a daemon older than the
  // running byte totals.
  double exchanges = -1;
  double bytes_sent = -1;
  double bytes_received = -1;
};

class WatchRates {
 public:
  // The rates of every bucket of `now` over the `seconds` since the answer of the previous
  // Update (all unknown on the first call and after Forget). A bucket that was not in the
  // previous answer, or whose counts went down (its id was registered again, counts restart
  // from 0), counts from 0.
  std::map<uint64_t, BucketRates> Update(const v1::GetStatsResponse& now, double seconds);
  // The next Update has no earlier answer (e.g. the daemon did not answer).
  void Forget() { have_previous_ = false; }

 private:
  struct Counts {
    uint64_t exchanges = 0, sent = 0, received = 0;
  };
  bool have_previous_ = false;
  std::map<uint64_t, Counts> previous_;
};

// The table `spexctl watch` prints: its header line, and a bucket's row (id, compressor, data
// type as `spexctl stats` shows it, state, pattern, exchanges/s, target and achieved density,
// bytes sent and received per second, the last exchange's phases in ms). Both end in '\n'.
std::string WatchHeader();
std::string WatchRow(const v1::BucketStats& b, const BucketRates& r);

// 1234 -> "1.2K", in powers of 1000; "-" for a negative (unknown) value.
std::string HumanRate(double v);

}  // namespace spex
