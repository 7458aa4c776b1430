// The mergers' grouping logic (mergers.h: none, fixed, omgs, rgmerge), pure objects the engine asks
// which ready buckets to fuse into one exchange.
#include "daemon/merge/mergers.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/merge/mgs_plan.h"
#include "daemon/merge/rgmerge_model.h"

namespace spex {
namespace {

uint64_t HashWords(const char* name, std::initializer_list<uint64_t> words) {
  uint64_t h = Fnv1a(kFnvOffset, name, std::char_traits<char>::length(name));
  for (uint64_t w : words) h = Fnv1a(h, &w, sizeof(w));
  return h;
}

absl::Status CheckLimits(const GroupLimits& limits) {
  if (limits.max_group_elements == 0) {
    return absl::InvalidArgumentError("--max_group_elements must be >= 1");
  }
  if (limits.window == 0 || limits.window > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--merge_window must be in [1, 64] (the agreement round carries 64 keys); got ",
        limits.window));
  }
  return absl::OkStatus();
}

// Greedy from the front: a new group starts where `fits` says the next member would not fit, or
// where ClampGroup (step, P, max_group_elements) cuts.
template <typename Fits>
std::vector<size_t> GreedyPack(absl::Span<const MergeCandidate> c, const GroupLimits& limits,
                               Fits fits) {
  std::vector<size_t> groups;
  size_t i = 0;
  while (i < c.size()) {
    const size_t legal = ClampGroup(c.subspan(i), c.size() - i, limits);
    uint64_t sum = c[i].elements;
    size_t n = 1;
    while (n < legal && fits(sum, c[i + n].elements)) {
      sum += c[i + n].elements;
      ++n;
    }
    groups.push_back(n);
    i += n;
  }
  return groups;
}

class FixedMerger : public Merger {
 public:
  explicit FixedMerger(const FixedOptions& o) : o_(o) {}
  const char* name() const override { return "fixed"; }
  bool agreed() const override { return true; }
  // The cycle time may differ between nodes (docs/merging.md 3), so it is not hashed.
  uint64_t ConfigHash() const override {
    return HashWords("fixed", {o_.threshold_bytes, o_.limits.window, o_.limits.max_group_elements});
  }
  size_t NextGroup(absl::Span<const MergeCandidate> c) override {
    return c.empty() ? 0 : 1;  // never used: agreed mergers go through Offer/Pack
  }
  size_t Offer(absl::Span<const MergeCandidate> c, int64_t now_ns, int64_t* deadline_ns) override {
    const int64_t cycle_ns = o_.cycle_ms * 1000000;
    if (has_round_ && now_ns < last_round_ns_ + cycle_ns) {
      *deadline_ns = last_round_ns_ + cycle_ns;
      return 0;
    }
    const size_t r = ReadyPrefix(c, o_.limits.window);
    if (r == 0) return 0;
    // A round that starts late (engine busy past the deadline) starts at once, as Horovod's
    // next cycle does after a long one.
    has_round_ = true;
    last_round_ns_ = now_ns;
    return r;
  }
  std::vector<size_t> Pack(absl::Span<const MergeCandidate> agreed) override {
    const uint64_t t = o_.threshold_bytes;
    return GreedyPack(agreed, o_.limits,
                      [t](uint64_t sum, uint64_t next) { return t != 0 && 4 * (sum + next) <= t; });
  }

 private:
  FixedOptions o_;
  bool has_round_ = false;
  int64_t last_round_ns_ = 0;
};

class OmgsMerger : public Merger {
 public:
  explicit OmgsMerger(const OmgsOptions& o) : o_(o) {}
  const char* name() const override { return "omgs"; }
  uint64_t ConfigHash() const override {
    return HashWords(
        "omgs", {static_cast<uint64_t>(o_.mode), o_.threshold_elements, o_.count, o_.limits.window,
                 o_.limits.max_group_elements, o_.select_behind ? 1u : 0u});
  }
  bool behind() const override { return o_.select_behind; }
  // The plan group starting at the head: threshold closes WITH the bucket that brings the
  // running sum to >= T_el; count closes with the count-th bucket. Then the shared rules.
  size_t NextGroup(absl::Span<const MergeCandidate> c) override {
    if (c.empty()) return 0;
    size_t want = 0;
    if (o_.mode == OmgsMode::kCount) {
      want = static_cast<size_t>(o_.count);
    } else {
      uint64_t sum = 0;
      while (want < c.size()) {
        sum += c[want].elements;
        ++want;
        if (sum >= o_.threshold_elements) break;
      }
    }
    return ClampGroup(c, want, o_.limits);
  }

 private:
  OmgsOptions o_;
};

// The newest `capacity` (bytes, wire time) samples of a node's packs and the least-squares line
// through them (alpha: the start-up, beta: the per-byte cost). Not thread-safe: its owner locks.
class FitWindow {
 public:
  explicit FitWindow(size_t capacity) : capacity_(capacity) {}
  void Add(uint64_t bytes, int64_t ns) {
    x_.push_back(static_cast<double>(bytes));
    y_.push_back(static_cast<double>(ns));
    if (x_.size() > capacity_) {
      x_.pop_front();
      y_.pop_front();
    }
  }
  size_t size() const { return x_.size(); }  // samples held (at most the capacity)
  // False while fewer than two distinct sizes were seen (FitLine).
  bool Fit(double* alpha, double* beta) const {
    return FitLine(std::vector<double>(x_.begin(), x_.end()),
                   std::vector<double>(y_.begin(), y_.end()), alpha, beta);
  }

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
  void Member(uint64_t bucket_id, uint64_t step, int64_t ready_ns) {
    if (has_prev_ && prev_step_ == step && ready_ns > 0 && prev_ready_ns_ > 0) {
      // Stamps come from trainers: an absurd one makes a gap of at most an hour.
      const int64_t gap = std::clamp<int64_t>(ready_ns - prev_ready_ns_, 0, kMaxGapNs);
      auto [it, fresh] = gap_ns_.try_emplace(bucket_id, gap);
      if (!fresh) it->second += (gap - it->second) / 4;  // EWMA, weight 1/4
    }
    has_prev_ = true;
    prev_step_ = step;
    prev_ready_ns_ = ready_ns;
  }
  void Exchange(uint64_t bytes, int64_t ns) {
    if (fixed_alpha_ns_ > 0) return;
    absl::MutexLock lock(&mu_);
    fit_.Add(bytes, ns);
    double alpha = 0, beta = 0;
    if (fit_.Fit(&alpha, &beta)) {
      alpha_ns_.store(static_cast<int64_t>(std::clamp(alpha, 0.0, 1e9)), std::memory_order_relaxed);
    }
  }
  void IdleSince(int64_t ns) { idle_since_ns_ = ns; }
  int64_t idle_since_ns() const { return idle_since_ns_; }
  int64_t alpha_ns() const { return alpha_ns_.load(std::memory_order_relaxed); }

  // `r` >= 1 candidates are offerable now: 0 (and *deadline_ns) to wait for the next one, or r.
  size_t Offer(absl::Span<const MergeCandidate> c, size_t r, size_t window, int64_t now_ns,
               int64_t* deadline_ns) {
    if (!has_head_ || head_id_ != c[0].bucket_id || head_step_ != c[0].step) {
      has_head_ = true;  // a new head: its linger starts now
      head_id_ = c[0].bucket_id;
      head_step_ = c[0].step;
      head_since_ns_ = now_ns;
    }
    const size_t j = r;  // the first candidate not offerable
    if (j >= c.size() || j >= window || c[j].ready || c[j].step != c[0].step ||
        c[j].kind == MergeKind::kProbe) {
      return r;  // the window is full, the step ends here or the next bucket goes alone
    }
    const int64_t alpha = alpha_ns();
    if (now_ns - idle_since_ns_ < alpha) return r;  // right after an exchange: never linger
    auto it = gap_ns_.find(c[j].bucket_id);
    // Nothing to expect it by, or a stamp so far off that the sums below could overflow.
    if (it == gap_ns_.end() || c[j - 1].ready_ns <= 0 ||
        c[j - 1].ready_ns > std::numeric_limits<int64_t>::max() - 2 * kMaxGapNs) {
      return r;
    }
    const int64_t expected = c[j - 1].ready_ns + it->second;
    if (expected - now_ns > alpha) return r;  // waiting longer than a start-up saves nothing
    const int64_t until =
        std::min(expected + it->second / 10, head_since_ns_ + max_ns_);  // capped per head
    if (until <= now_ns) return r;
    *deadline_ns = until;
    return 0;
  }

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

  void HandedOff(uint64_t elements, int64_t local_ns, int64_t wire_start_ns) {
    absl::MutexLock lock(&mu_);
    local_.Add(elements, local_ns);
    wire_elements_ = elements;
    wire_start_ns_ = wire_start_ns;
  }
  void Done(uint64_t elements, int64_t wire_ns) {
    absl::MutexLock lock(&mu_);
    wire_.Add(elements, wire_ns);
  }
  // True, with *deadline_ns, while a round for `elements` started now would end its local work
  // before the pack on the wire ends (both estimated): the round should start at *deadline_ns.
  bool Wait(uint64_t elements, int64_t now_ns, bool wire_busy, int64_t* deadline_ns) {
    if (!wire_busy) return false;
    absl::MutexLock lock(&mu_);
    if (local_.size() < kMinSamples || wire_.size() < kMinSamples) return false;
    double la = 0, lb = 0, wa = 0, wb = 0;
    if (!local_.Fit(&la, &lb) || !wire_.Fit(&wa, &wb)) return false;
    const double local = std::clamp(la + lb * static_cast<double>(elements), 0.0, kMaxNs);
    const double wire = std::clamp(wa + wb * static_cast<double>(wire_elements_), 0.0, kMaxNs);
    const int64_t start = wire_start_ns_ + static_cast<int64_t>(wire) - static_cast<int64_t>(local);
    if (start <= now_ns) return false;
    *deadline_ns = start;
    return true;
  }

 private:
  absl::Mutex mu_;
  FitWindow local_ ABSL_GUARDED_BY(mu_){kFitSamples};
  FitWindow wire_ ABSL_GUARDED_BY(mu_){kFitSamples};
  uint64_t wire_elements_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t wire_start_ns_ ABSL_GUARDED_BY(mu_) = 0;
};

class RgmergeReadyMerger : public Merger {
 public:
  explicit RgmergeReadyMerger(const RgmergeOptions& o)
      : o_(o), linger_(o.linger_max_ns, o.alpha_ns) {}
  const char* name() const override { return "rgmerge"; }
  bool agreed() const override { return true; }
  // The linger settings may differ between nodes (docs/merging.md 2.7): not hashed.
  uint64_t ConfigHash() const override {
    return HashWords("rgmerge/ready", {o_.limits.window, o_.limits.max_group_elements});
  }
  size_t NextGroup(absl::Span<const MergeCandidate> c) override { return c.empty() ? 0 : 1; }
  // Linger off: the previous exchange's duration is the merge window. auto: see RgmergeOptions.
  // bind late: see RgmergeOptions::bind_late.
  size_t Offer(absl::Span<const MergeCandidate> c, int64_t now_ns, int64_t* deadline_ns) override {
    const size_t r = ReadyPrefix(c, o_.limits.window);
    if (r == 0) return r;
    if (o_.bind_late) {
      uint64_t elements = 0;  // the first pack Pack would make of the ready prefix
      for (size_t i = 0; i < ClampGroup(c, r, o_.limits); ++i) elements += c[i].elements;
      // The scheduler passes `now` as the idle time while a pack is on the wire.
      const bool wire_busy = linger_.idle_since_ns() == now_ns;
      if (clock_.Wait(elements, now_ns, wire_busy, deadline_ns)) return 0;
    }
    if (!o_.linger_auto) return r;
    return linger_.Offer(c, r, o_.limits.window, now_ns, deadline_ns);
  }
  std::vector<size_t> Pack(absl::Span<const MergeCandidate> agreed) override {
    return GreedyPack(agreed, o_.limits, [](uint64_t, uint64_t) { return true; });
  }
  bool measures() const override { return o_.linger_auto; }
  void ObserveMember(uint64_t bucket_id, uint64_t step, int64_t ready_ns,
                     int64_t /*select_ns*/) override {
    if (o_.linger_auto) linger_.Member(bucket_id, step, ready_ns);
  }
  void ObserveExchange(uint64_t bytes, int64_t ns) override {
    if (o_.linger_auto) linger_.Exchange(bytes, ns);
  }
  void ExchangeIdleSince(int64_t ns) override { linger_.IdleSince(ns); }
  void PackHandedOff(uint64_t elements, int64_t local_ns, int64_t wire_start_ns) override {
    if (o_.bind_late) clock_.HandedOff(elements, local_ns, wire_start_ns);
  }
  void PackDone(uint64_t elements, int64_t wire_ns) override {
    if (o_.bind_late) clock_.Done(elements, wire_ns);
  }

 protected:
  RgmergeOptions o_;
  Linger linger_;
  WireClock clock_;
};

// The measurements of docs/merging.md 2.6, shared by the measuring mergers (thread-safe: the wire
// thread reports exchanges). Inputs(): per bucket the median backward gap g_b (0 for the first of
// a step) and the median Select time sigma_b over the last kSamples steps, then alpha (ns) and
// beta (ps per byte) from a least-squares line through the newest kFitSamples (bytes, time)
// samples (clamped at 0; SAFusion's defaults while no line can be fitted).
class PlanSamples {
 public:
  static constexpr size_t kSamples = 16;      // M: the medians' window
  static constexpr size_t kFitSamples = 256;  // the newest exchanges the fit uses

  void Member(uint64_t bucket_id, uint64_t step, int64_t ready_ns, int64_t select_ns) {
    absl::MutexLock lock(&mu_);
    Samples& s = samples_[bucket_id];
    s.ready.push_back({step, ready_ns});
    if (s.ready.size() > kSamples) s.ready.pop_front();
    s.select.push_back(select_ns);
    if (s.select.size() > kSamples) s.select.pop_front();
  }
  void Exchange(uint64_t bytes, int64_t ns) {
    absl::MutexLock lock(&mu_);
    fit_.Add(bytes, ns);
  }
  // Words: g_0 .. g_{L-1}, sigma_0 .. sigma_{L-1}, alpha (ns; `fixed_alpha_ns` when > 0), beta.
  std::vector<uint64_t> Inputs(absl::Span<const PlanBucket> buckets, int64_t fixed_alpha_ns) {
    absl::MutexLock lock(&mu_);
    const size_t L = buckets.size();
    std::vector<uint64_t> w(2 * L + 2, 0);
    for (size_t b = 0; b < L; ++b) {
      auto it = samples_.find(buckets[b].bucket_id);
      if (it == samples_.end()) continue;
      w[L + b] = static_cast<uint64_t>(std::max<int64_t>(
          0, MedianOf(std::vector<int64_t>(it->second.select.begin(), it->second.select.end()))));
      if (b == 0) continue;  // the first bucket of a step has no gap
      auto prev = samples_.find(buckets[b - 1].bucket_id);
      if (prev == samples_.end()) continue;
      std::vector<int64_t> gaps;
      for (const auto& [step, t] : it->second.ready) {
        for (const auto& [pstep, pt] : prev->second.ready) {
          if (pstep == step && t > 0 && pt > 0) gaps.push_back(std::max<int64_t>(0, t - pt));
        }
      }
      w[b] = static_cast<uint64_t>(MedianOf(std::move(gaps)));
    }
    RgmergeModelInputs defaults;
    double alpha = 0, beta = 0;
    if (fit_.Fit(&alpha, &beta)) {
      w[2 * L] = static_cast<uint64_t>(std::max(0.0, alpha));
      w[2 * L + 1] = static_cast<uint64_t>(std::max(0.0, beta * 1000.0));  // ns/B -> ps/B
    } else {
      w[2 * L] = static_cast<uint64_t>(defaults.alpha_ns);
      w[2 * L + 1] = static_cast<uint64_t>(defaults.beta_ps_per_byte);
    }
    if (fixed_alpha_ns > 0) w[2 * L] = static_cast<uint64_t>(fixed_alpha_ns);
    return w;
  }

 private:
  struct Samples {
    std::deque<std::pair<uint64_t, int64_t>> ready;  // (step, ready_ns)
    std::deque<int64_t> select;
  };
  absl::Mutex mu_;
  std::map<uint64_t, Samples> samples_ ABSL_GUARDED_BY(mu_);
  FitWindow fit_ ABSL_GUARDED_BY(mu_){kFitSamples};
};

// Agreed words come from every node's measurements, which a hostile or broken trainer's ready
// stamps can make absurd: times are capped at an hour and beta at 10 us per byte (100 KB/s), so
// the plans' sums and products stay far from overflow (a bad input can only make a poor plan).
constexpr uint64_t kMaxPlanNs = uint64_t{3600} * 1000000000;
constexpr uint64_t kMaxBetaPs = 10000000;
constexpr uint64_t kMaxSelectFs = 1000000000;
int64_t PlanNs(uint64_t v) { return static_cast<int64_t>(std::min(v, kMaxPlanNs)); }

// An installed static plan: its groups of bucket ids, where each bucket is, the step it takes
// effect and its hash (engine thread only).
class PlanTable {
 public:
  // Read by the wire thread too (measures()): atomic.
  bool done() const { return done_.load(std::memory_order_relaxed); }
  bool planned() const { return planned_; }
  bool Active(uint64_t step) const { return planned_ && step >= effective_; }
  uint64_t hash() const { return hash_; }
  const std::vector<size_t>& lengths() const { return lengths_; }
  void Abandon() {
    done_ = true;
    planned_ = false;
  }
  void Install(absl::Span<const PlanBucket> buckets, const std::vector<size_t>& plan,
               absl::Span<const uint64_t> agreed, uint64_t step) {
    done_ = true;
    planned_ = true;
    effective_ = step + 1;
    lengths_ = plan;
    groups_.clear();
    where_.clear();
    uint64_t h = kFnvOffset;
    size_t b = 0;
    for (size_t len : plan) {
      groups_.emplace_back();
      for (size_t i = 0; i < len; ++i, ++b) {
        where_[buckets[b].bucket_id] = {groups_.size() - 1, i};
        groups_.back().push_back(buckets[b].bucket_id);
        h = Fnv1a(h, &buckets[b].bucket_id, sizeof(uint64_t));
      }
      const uint64_t n = len;
      h = Fnv1a(h, &n, sizeof(n));
    }
    for (uint64_t word : agreed) h = Fnv1a(h, &word, sizeof(word));
    hash_ = h | 1;  // never 0, the hash before a plan
  }
  // The plan group that holds the head, from the head on, as far as the candidates follow the
  // plan's order (a bucket the plan does not know goes alone).
  size_t NextGroup(absl::Span<const MergeCandidate> c, const GroupLimits& limits) const {
    if (c.empty()) return 0;
    auto it = where_.find(c[0].bucket_id);
    if (it == where_.end()) return 1;
    const size_t g = it->second.first, pos = it->second.second;
    const std::vector<uint64_t>& ids = groups_[g];
    size_t want = 1;
    while (pos + want < ids.size() && want < c.size() && c[want].bucket_id == ids[pos + want]) {
      ++want;
    }
    return ClampGroup(c, want, limits);
  }

 private:
  std::atomic<bool> done_{false};
  bool planned_ = false;
  uint64_t effective_ = 0, hash_ = 0;
  std::vector<size_t> lengths_;
  std::vector<std::vector<uint64_t>> groups_;
  std::map<uint64_t, std::pair<size_t, size_t>> where_;  // id -> (group, position)
};

std::string Lengths(const std::vector<size_t>& plan) {
  std::string out;
  for (size_t len : plan) absl::StrAppend(&out, out.empty() ? "" : " ", len);
  return out;
}

// `rgmerge --rgmerge_plan=model`: `ready` while it measures, then the agreed static plan.
class RgmergeModelMerger : public RgmergeReadyMerger {
 public:
  explicit RgmergeModelMerger(const RgmergeOptions& o) : RgmergeReadyMerger(o), m_(o) {}
  bool AgreedAt(uint64_t step) const override { return !plan_.Active(step); }
  uint64_t ConfigHash() const override {
    return HashWords("rgmerge/model", {m_.limits.window, m_.limits.max_group_elements, m_.plan_step,
                                       static_cast<uint64_t>(m_.slack_ns), m_.equal_tail ? 1u : 0u,
                                       m_.select_behind ? 1u : 0u,
                                       static_cast<uint64_t>(m_.alpha_ns), plan_.hash()});
  }
  bool behind() const override { return m_.select_behind; }
  size_t NextGroup(absl::Span<const MergeCandidate> c) override {
    return plan_.NextGroup(c, m_.limits);
  }
  // Only until the plan is agreed: later timings would never be used (the linger, too, only
  // runs while the merger is agreed).
  bool measures() const override { return !plan_.done(); }
  void ObserveMember(uint64_t bucket_id, uint64_t step, int64_t ready_ns,
                     int64_t select_ns) override {
    samples_.Member(bucket_id, step, ready_ns, select_ns);
    RgmergeReadyMerger::ObserveMember(bucket_id, step, ready_ns, select_ns);
  }
  void ObserveExchange(uint64_t bytes, int64_t ns) override {
    samples_.Exchange(bytes, ns);
    RgmergeReadyMerger::ObserveExchange(bytes, ns);
  }
  bool PlanDue(uint64_t step) const override { return !plan_.done() && step >= m_.plan_step; }
  std::vector<uint64_t> PlanInputs(absl::Span<const PlanBucket> buckets) override {
    return samples_.Inputs(buckets, m_.alpha_ns);
  }
  void InstallPlan(absl::Span<const PlanBucket> buckets, absl::Span<const uint64_t> agreed,
                   uint64_t step, const PlanContext& ctx) override {
    const size_t L = buckets.size();
    if (L == 0 || agreed.size() != 2 * L + 2) {
      AbandonPlan("the agreed inputs do not match the bucket list");
      return;
    }
    RgmergeModelInputs in;
    in.elements.resize(L);
    in.gap_ns.resize(L);
    in.select_ns.resize(L);
    for (size_t b = 0; b < L; ++b) {
      in.elements[b] = buckets[b].elements;
      in.gap_ns[b] = PlanNs(agreed[b]);
      in.select_ns[b] = PlanNs(agreed[L + b]);
    }
    in.alpha_ns = PlanNs(agreed[2 * L]);
    in.beta_ps_per_byte = static_cast<int64_t>(std::min(agreed[2 * L + 1], kMaxBetaPs));
    in.density = ctx.density;
    in.nodes = ctx.nodes;
    in.slack_ns = m_.slack_ns;
    in.equal_tail = m_.equal_tail;
    plan_.Install(buckets, RgmergeModelPlan(in), agreed, step);
    inputs_ = std::move(in);
  }
  void AbandonPlan(const std::string& /*why*/) override { plan_.Abandon(); }
  std::string PlanSummary() const override {
    if (!plan_.planned()) return "";
    int64_t gaps = 0, selects = 0;
    for (int64_t g : inputs_.gap_ns) gaps += g;
    for (int64_t c : inputs_.select_ns) selects += c;
    return absl::StrCat(plan_.lengths().size(), " groups of [", Lengths(plan_.lengths()),
                        "] buckets; alpha ", inputs_.alpha_ns / 1000, " us, beta ",
                        inputs_.beta_ps_per_byte, " ps/B, backward gaps ", gaps / 1000,
                        " us and selection ", selects / 1000, " us in all");
  }

 private:
  RgmergeOptions m_;
  PlanSamples samples_;
  PlanTable plan_;
  RgmergeModelInputs inputs_;
};

// `omgs --omgs_mode=mgs` (docs/merging.md 4.3): one bucket per exchange (as `none`) while it
// measures, then OMGS-SGD's adaptive plan (mgs_plan.h) on the agreed inputs, a static plan.
class OmgsMgsMerger : public Merger {
 public:
  explicit OmgsMgsMerger(const OmgsOptions& o) : o_(o) {}
  const char* name() const override { return "omgs"; }
  uint64_t ConfigHash() const override {
    return HashWords(
        "omgs/mgs", {o_.limits.window, o_.limits.max_group_elements, o_.plan_step,
                     o_.select_behind ? 1u : 0u, static_cast<uint64_t>(o_.alpha_ns), plan_.hash()});
  }
  bool behind() const override { return o_.select_behind; }
  size_t NextGroup(absl::Span<const MergeCandidate> c) override {
    if (c.empty()) return 0;
    return plan_.Active(c[0].step) ? plan_.NextGroup(c, o_.limits) : 1;
  }
  // Only until the plan is agreed: later timings would never be used.
  bool measures() const override { return !plan_.done(); }
  void ObserveMember(uint64_t bucket_id, uint64_t step, int64_t ready_ns,
                     int64_t select_ns) override {
    samples_.Member(bucket_id, step, ready_ns, select_ns);
  }
  void ObserveExchange(uint64_t bytes, int64_t ns) override { samples_.Exchange(bytes, ns); }
  bool PlanDue(uint64_t step) const override { return !plan_.done() && step >= o_.plan_step; }
  // rgmerge's words, then s (fs per element * log2 element) fitted to this node's sigma_b and
  // n_b log2 n_b, so every node agrees on one s.
  std::vector<uint64_t> PlanInputs(absl::Span<const PlanBucket> buckets) override {
    std::vector<uint64_t> w = samples_.Inputs(buckets, o_.alpha_ns);
    const size_t L = buckets.size();
    std::vector<uint64_t> n(L);
    std::vector<int64_t> sigma(L);
    for (size_t b = 0; b < L; ++b) {
      n[b] = buckets[b].elements;
      sigma[b] = PlanNs(w[L + b]);
    }
    w.push_back(static_cast<uint64_t>(FitSelectFs(n, sigma, MgsInputs().select_fs)));
    return w;
  }
  void InstallPlan(absl::Span<const PlanBucket> buckets, absl::Span<const uint64_t> agreed,
                   uint64_t step, const PlanContext& ctx) override {
    const size_t L = buckets.size();
    if (L == 0 || agreed.size() != 2 * L + 3) {
      AbandonPlan("the agreed inputs do not match the bucket list");
      return;
    }
    MgsInputs in;
    for (size_t b = 0; b < L; ++b) {
      in.elements.push_back(buckets[b].elements);
      in.gap_ns.push_back(PlanNs(agreed[b]));
      in.dense.push_back(buckets[b].kind == MergeKind::kDense);
    }
    in.alpha_ns = PlanNs(agreed[2 * L]);
    in.beta_ps_per_byte = static_cast<int64_t>(std::min(agreed[2 * L + 1], kMaxBetaPs));
    in.select_fs = static_cast<int64_t>(std::min(agreed[2 * L + 2], kMaxSelectFs));
    in.density = ctx.density;
    in.nodes = ctx.nodes;
    in.behind = o_.select_behind;
    plan_.Install(buckets, MgsPlan(in), agreed, step);
    inputs_ = std::move(in);
  }
  void AbandonPlan(const std::string& /*why*/) override { plan_.Abandon(); }
  std::string PlanSummary() const override {
    if (!plan_.planned()) return "";
    int64_t gaps = 0;
    for (int64_t g : inputs_.gap_ns) gaps += g;
    return absl::StrCat(plan_.lengths().size(), " groups of [", Lengths(plan_.lengths()),
                        "] buckets; alpha ", inputs_.alpha_ns / 1000, " us, beta ",
                        inputs_.beta_ps_per_byte, " ps/B, s ", inputs_.select_fs,
                        " fs per element-log2, backward gaps ", gaps / 1000, " us in all");
  }

 private:
  OmgsOptions o_;
  PlanSamples samples_;
  PlanTable plan_;
  MgsInputs inputs_;
};

}  // namespace

int64_t MedianOf(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  const size_t mid = (v.size() - 1) / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}

bool FitLine(const std::vector<double>& x, const std::vector<double>& y, double* alpha,
             double* beta) {
  const size_t n = std::min(x.size(), y.size());
  if (n < 2) return false;
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) {
    mx += x[i];
    my += y[i];
  }
  mx /= static_cast<double>(n);
  my /= static_cast<double>(n);
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
  }
  if (!(sxx > 0)) return false;
  *beta = sxy / sxx;
  *alpha = my - *beta * mx;
  return std::isfinite(*alpha) && std::isfinite(*beta);
}

// A linger longer than a second waits for a bucket that is not coming soon.
constexpr int64_t kMaxLingerNs = 1000000000;

absl::StatusOr<std::unique_ptr<Merger>> MakeFixedMerger(const FixedOptions& options) {
  if (absl::Status s = CheckLimits(options.limits); !s.ok()) return s;
  if (options.cycle_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fixed_cycle_ms must be >= 0; got ", options.cycle_ms));
  }
  return std::unique_ptr<Merger>(new FixedMerger(options));
}

absl::StatusOr<std::unique_ptr<Merger>> MakeOmgsMerger(const OmgsOptions& options) {
  if (absl::Status s = CheckLimits(options.limits); !s.ok()) return s;
  if (options.mode == OmgsMode::kMgs) {
    if (options.alpha_ns < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--merge_alpha_us must be >= 0 (0: measured); got ", options.alpha_ns / 1000));
    }
    if (options.plan_step == 0) {
      return absl::InvalidArgumentError(
          "--merge_plan_step must be >= 1 (the step whose first group agrees on the plan)");
    }
    return std::unique_ptr<Merger>(new OmgsMgsMerger(options));
  }
  if (options.mode == OmgsMode::kThreshold && options.threshold_elements == 0) {
    return absl::InvalidArgumentError("--omgs_threshold_elements must be >= 1");
  }
  if (options.mode == OmgsMode::kCount && options.count == 0) {
    return absl::InvalidArgumentError("--omgs_count must be >= 1");
  }
  return std::unique_ptr<Merger>(new OmgsMerger(options));
}

absl::StatusOr<std::unique_ptr<Merger>> MakeRgmergeReadyMerger(const RgmergeOptions& options) {
  if (absl::Status s = CheckLimits(options.limits); !s.ok()) return s;
  if (options.linger_max_ns < 0 || options.linger_max_ns > kMaxLingerNs) {
    return absl::InvalidArgumentError(absl::StrCat("--rgmerge_linger_max_us must be in [0, ",
                                                   kMaxLingerNs / 1000, "]; got ",
                                                   options.linger_max_ns / 1000));
  }
  if (options.alpha_ns < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--merge_alpha_us must be >= 0 (0: measured); got ", options.alpha_ns / 1000));
  }
  return std::unique_ptr<Merger>(new RgmergeReadyMerger(options));
}

absl::StatusOr<std::unique_ptr<Merger>> MakeRgmergeMerger(const RgmergeOptions& options) {
  if (!options.model && options.select_behind) {
    return absl::InvalidArgumentError(
        "--rgmerge_select=behind needs --rgmerge_plan=model: the ready plan's groups change "
        "every step, and a group exchanged as one bucket needs the same members every step");
  }
  if (!options.model) return MakeRgmergeReadyMerger(options);
  if (absl::StatusOr<std::unique_ptr<Merger>> ready = MakeRgmergeReadyMerger(options);
      !ready.ok()) {
    return ready.status();  // the limits, the linger, alpha
  }
  if (options.plan_step == 0) {
    return absl::InvalidArgumentError(
        "--merge_plan_step must be >= 1 (the step whose first group agrees on the plan)");
  }
  if (options.slack_ns < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rgmerge_slack_us must be >= 0; got ", options.slack_ns / 1000));
  }
  return std::unique_ptr<Merger>(new RgmergeModelMerger(options));
}

absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(MergerPolicy policy, const MergeParams& params) {
  switch (policy) {
    case MergerPolicy::kNone:
      return MakeNoMerger();
    case MergerPolicy::kFixed: {
      FixedOptions o;
      o.threshold_bytes = params.fixed_threshold_bytes;
      o.cycle_ms = params.fixed_cycle_ms;
      o.limits = params.limits;
      return MakeFixedMerger(o);
    }
    case MergerPolicy::kOmgs: {
      OmgsOptions o;
      o.mode = params.omgs_mode;
      o.plan_step = params.plan_step;
      o.threshold_elements = params.omgs_threshold_elements;
      o.count = params.omgs_count;
      o.select_behind = params.omgs_select_behind;
      o.alpha_ns = params.merge_alpha_us * 1000;
      o.limits = params.limits;
      return MakeOmgsMerger(o);
    }
    case MergerPolicy::kRgmerge: {
      RgmergeOptions o;
      o.limits = params.limits;
      o.model = params.rgmerge_model;
      o.plan_step = params.plan_step;
      o.slack_ns = params.rgmerge_slack_us * 1000;
      o.equal_tail = params.rgmerge_equal_tail;
      o.select_behind = params.rgmerge_select_behind;
      o.alpha_ns = params.merge_alpha_us * 1000;
      o.linger_auto = params.rgmerge_linger_auto;
      if (params.rgmerge_linger_max_us < 0 || params.rgmerge_linger_max_us > kMaxLingerNs / 1000) {
        return absl::InvalidArgumentError(absl::StrCat("--rgmerge_linger_max_us must be in [0, ",
                                                       kMaxLingerNs / 1000, "]; got ",
                                                       params.rgmerge_linger_max_us));
      }
      o.linger_max_ns = params.rgmerge_linger_max_us * 1000;
      o.bind_late = params.rgmerge_bind_late;
      return MakeRgmergeMerger(o);
    }
  }
  return absl::InvalidArgumentError("--merger: unknown policy");
}

}  // namespace spex
