// The mergers' timing machinery (merge_timing.h): the line fit, the linger, the wire clock and
// the plan samples.
#include "daemon/merge/merge_timing.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "daemon/merge/rgmerge_model.h"

namespace spex {

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

void FitWindow::Add(uint64_t bytes, int64_t ns) {
  x_.push_back(static_cast<double>(bytes));
  y_.push_back(static_cast<double>(ns));
  if (x_.size() > capacity_) {
    x_.pop_front();
    y_.pop_front();
  }
}

bool FitWindow::Fit(double* alpha, double* beta) const {
  return FitLine(std::vector<double>(x_.begin(), x_.end()),
                 std::vector<double>(y_.begin(), y_.end()), alpha, beta);
}

void Linger::Member(uint64_t bucket_id, uint64_t step, int64_t ready_ns) {
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

void Linger::Exchange(uint64_t bytes, int64_t ns) {
  if (fixed_alpha_ns_ > 0) return;
  absl::MutexLock lock(&mu_);
  fit_.Add(bytes, ns);
  double alpha = 0, beta = 0;
  if (fit_.Fit(&alpha, &beta)) {
    alpha_ns_.store(static_cast<int64_t>(std::clamp(alpha, 0.0, 1e9)), std::memory_order_relaxed);
  }
}

size_t Linger::Offer(absl::Span<const MergeCandidate> c, size_t r, size_t window, int64_t now_ns,
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

void WireClock::HandedOff(uint64_t elements, int64_t local_ns, int64_t wire_start_ns) {
  absl::MutexLock lock(&mu_);
  local_.Add(elements, local_ns);
  wire_elements_ = elements;
  wire_start_ns_ = wire_start_ns;
}

void WireClock::Done(uint64_t elements, int64_t wire_ns) {
  absl::MutexLock lock(&mu_);
  wire_.Add(elements, wire_ns);
}

bool WireClock::Wait(uint64_t elements, int64_t now_ns, bool wire_busy, int64_t* deadline_ns) {
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

void PlanSamples::Member(uint64_t bucket_id, uint64_t step, int64_t ready_ns, int64_t select_ns) {
  absl::MutexLock lock(&mu_);
  Samples& s = samples_[bucket_id];
  s.ready.push_back({step, ready_ns});
  if (s.ready.size() > kSamples) s.ready.pop_front();
  s.select.push_back(select_ns);
  if (s.select.size() > kSamples) s.select.pop_front();
}

void PlanSamples::Exchange(uint64_t bytes, int64_t ns) {
  absl::MutexLock lock(&mu_);
  fit_.Add(bytes, ns);
}

uint64_t PlanSamples::MedianGap(const Samples& s, const Samples& prev) {
  std::vector<int64_t> gaps;
  for (const auto& [step, t] : s.ready) {
    for (const auto& [pstep, pt] : prev.ready) {
      if (pstep == step && t > 0 && pt > 0) gaps.push_back(std::max<int64_t>(0, t - pt));
    }
  }
  return static_cast<uint64_t>(MedianOf(std::move(gaps)));
}

std::vector<uint64_t> PlanSamples::Inputs(absl::Span<const PlanBucket> buckets,
                                          int64_t fixed_alpha_ns) {
  absl::MutexLock lock(&mu_);
  const size_t num_buckets = buckets.size();
  std::vector<uint64_t> w(2 * num_buckets + 2, 0);
  for (size_t b = 0; b < num_buckets; ++b) {
    auto it = samples_.find(buckets[b].bucket_id);
    if (it == samples_.end()) continue;
    w[num_buckets + b] = static_cast<uint64_t>(std::max<int64_t>(
        0, MedianOf(std::vector<int64_t>(it->second.select.begin(), it->second.select.end()))));
    if (b == 0) continue;  // the first bucket of a step has no gap
    auto prev = samples_.find(buckets[b - 1].bucket_id);
    if (prev == samples_.end()) continue;
    w[b] = MedianGap(it->second, prev->second);
  }
  RgmergeModelInputs defaults;
  double alpha = 0, beta = 0;
  if (fit_.Fit(&alpha, &beta)) {
    w[2 * num_buckets] = static_cast<uint64_t>(std::max(0.0, alpha));
    w[2 * num_buckets + 1] = static_cast<uint64_t>(std::max(0.0, beta * 1000.0));  // ns/B -> ps/B
  } else {
    w[2 * num_buckets] = static_cast<uint64_t>(defaults.alpha_ns);
    w[2 * num_buckets + 1] = static_cast<uint64_t>(defaults.beta_ps_per_byte);
  }
  if (fixed_alpha_ns > 0) w[2 * num_buckets] = static_cast<uint64_t>(fixed_alpha_ns);
  return w;
}

}  // namespace spex
