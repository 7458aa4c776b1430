// The mergers' timing machinery (docs/merging.md 2.6, 5.1): the line fit, this node's linger
// (--rgmerge_linger=auto), its wire clock (--rgmerge_bind=late) and the plan samples of the
// mergers that measure before they plan. Local timings only: what the nodes agree on is made
// from them by the plan agreement (MergePlanner). Shared by the policy files of daemon/merge/.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/merge/merger.h"

namespace spex {

// The median of `v` (the lower one of an even count); 0 for an empty one.
int64_t MedianOf(std::vector<int64_t> v);
// Least squares y = alpha + beta * x over the samples; false when fewer than 2 samples or all x
// equal. (alpha, beta may come out negative: the caller clamps.)
bool FitLine(const std::vector<double>& x, const std::vector<double>& y, double* alpha,
             double* beta);

// A linger longer than a second waits for a bucket that is not coming soon
// (--rgmerge_linger_max_us's bound).
inline constexpr int64_t kMaxLingerNs = 1000000000;

// Agreed words come from every node's measurements, which a hostile or broken trainer's ready
// stamps can make absurd: times are capped at an hour and beta at 10 us per byte (100 KB/s), so
// the plans' sums and products stay far from overflow (a bad input can only make a poor plan).
inline constexpr uint64_t kMaxPlanNs = uint64_t{3600} * 1000000000;
inline constexpr uint64_t kMaxBetaPs = 10000000;
inline constexpr uint64_t kMaxSelectFs = 1000000000;
inline int64_t PlanNs(uint64_t v) { return static_cast<int64_t>(v < kMaxPlanNs ? v : kMaxPlanNs); }

// The newest `capacity` (bytes, wire time) samples of a node's packs and the least-squares line
// through them (alpha: the start-up, beta: the per-byte cost). Not thread-safe: its owner locks.
class FitWindow {
 public:
  explicit FitWindow(size_t capacity) : capacity_(capacity) {}
  void Add(uint64_t bytes, int64_t ns);
  size_t size() const { return x_.size(); }  // samples held (at most the capacity)
  // False while fewer than two distinct sizes were seen (FitLine).
  bool Fit(double* alpha, double* beta) const;

 private:
  const size_t capacity_;
  std::deque<double> x_, y_;
};

// --rgmerge_linger=auto's local state (docs/merging.md 5.1): per bucket an EWMA of the backward gap
// to its predecessor in canonical order, this node's alpha, when the engine last went idle and
// how long the current head has lingered. Members and offers come from the engine thread; the
// wire thread reports exchanges (alpha is atomic).
class Linger {
 public:
  static constexpr int64_t kDefaultAlphaNs = 3780000;  // SAFusion's start-up, until a fit exists
  static constexpr size_t kFitSamples = 64;
  static constexpr int64_t kMaxGapNs = int64_t{3600} * 1000000000;  // an hour

  Linger(int64_t max_ns, int64_t fixed_alpha_ns)
      : max_ns_(max_ns),
        fixed_alpha_ns_(fixed_alpha_ns),
        alpha_ns_(fixed_alpha_ns > 0 ? fixed_alpha_ns : kDefaultAlphaNs) {}

  // A member of a pack, in pack order (canonical): the gap to the member reported just before
  // it, when that one is of the same step.
  void Member(uint64_t bucket_id, uint64_t step, int64_t ready_ns);
  void Exchange(uint64_t bytes, int64_t ns);
  void IdleSince(int64_t ns) { idle_since_ns_ = ns; }
  int64_t idle_since_ns() const { return idle_since_ns_; }
  int64_t alpha_ns() const { return alpha_ns_.load(std::memory_order_relaxed); }

  // `r` >= 1 candidates are offerable now: 0 (and *deadline_ns) to wait for the next one, or r.
  size_t Offer(absl::Span<const MergeCandidate> c, size_t r, size_t window, int64_t now_ns,
               int64_t* deadline_ns);

 private:
  const int64_t max_ns_;
  const int64_t fixed_alpha_ns_;
  std::atomic<int64_t> alpha_ns_;
  absl::Mutex mu_;
  FitWindow fit_ ABSL_GUARDED_BY(mu_){kFitSamples};
  std::map<uint64_t, int64_t> gap_ns_;
  bool has_prev_ = false;
  uint64_t prev_step_ = 0;
  int64_t prev_ready_ns_ = 0;
  int64_t idle_since_ns_ = 0;
  bool has_head_ = false;
  uint64_t head_id_ = 0, head_step_ = 0;
  int64_t head_since_ns_ = 0;
};

// --rgmerge_bind=late's local state (RgmergeOptions::bind_late): least-squares lines of this
// node's packs' local time and wire time against their elements (the newest kFitSamples of
// each), and the pack last handed to the wire; whether it is still there comes with each Wait.
// HandedOff and Wait come from the engine thread, Done from the wire thread.
class WireClock {
 public:
  static constexpr size_t kFitSamples = 32;
  static constexpr size_t kMinSamples = 4;
  static constexpr double kMaxNs = 1e10;  // an estimate past 10 s is clamped there

  void HandedOff(uint64_t elements, int64_t local_ns, int64_t wire_start_ns);
  void Done(uint64_t elements, int64_t wire_ns);
  // True, with *deadline_ns, while a round for `elements` started now would end its local work
  // before the pack on the wire ends (both estimated): the round should start at *deadline_ns.
  bool Wait(uint64_t elements, int64_t now_ns, bool wire_busy, int64_t* deadline_ns);

 private:
  absl::Mutex mu_;
  FitWindow local_ ABSL_GUARDED_BY(mu_){kFitSamples};
  FitWindow wire_ ABSL_GUARDED_BY(mu_){kFitSamples};
  uint64_t wire_elements_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t wire_start_ns_ ABSL_GUARDED_BY(mu_) = 0;
};

// The measurements of docs/merging.md 2.6, shared by the mergers that plan (thread-safe: the wire
// thread reports exchanges). Inputs(): per bucket the median backward gap g_b (0 for the first of
// a step) and the median Select time sigma_b over the last kSamples steps, then alpha (ns) and
// beta (ps per byte) from a least-squares line through the newest kFitSamples (bytes, time)
// samples (clamped at 0; SAFusion's defaults while no line can be fitted).
class PlanSamples {
 public:
  static constexpr size_t kSamples = 16;      // M: the medians' window
  static constexpr size_t kFitSamples = 256;  // the newest exchanges the fit uses

  void Member(uint64_t bucket_id, uint64_t step, int64_t ready_ns, int64_t select_ns);
  void Exchange(uint64_t bytes, int64_t ns);
  // Words: g_0 .. g_{L-1}, sigma_0 .. sigma_{L-1}, alpha (ns; `fixed_alpha_ns` when > 0), beta.
  std::vector<uint64_t> Inputs(absl::Span<const PlanBucket> buckets, int64_t fixed_alpha_ns);

 private:
  struct Samples {
    std::deque<std::pair<uint64_t, int64_t>> ready;  // (step, ready_ns)
    std::deque<int64_t> select;
  };
  // The median gap of bucket `s` to its predecessor `prev` over the steps both saw.
  static uint64_t MedianGap(const Samples& s, const Samples& prev);

  absl::Mutex mu_;
  std::map<uint64_t, Samples> samples_ ABSL_GUARDED_BY(mu_);
  FitWindow fit_ ABSL_GUARDED_BY(mu_){kFitSamples};
};

}  // namespace spex
