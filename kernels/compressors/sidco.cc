// The SIDCo compressors sidco_e, sidco_p, sidco_gp (pattern B; Abdelmoniem et al., MLSys 2021;
// docs/algorithms.md#sidco): fit a sparsity-inducing distribution to |acc| and threshold it, in
// several stages: stage 1 keeps first_ratio = 0.25 of the mass; each later stage fits the
// exceedances over the previous threshold (peaks over threshold) with the per-stage ratio
// (d / 0.25)^(1 / (S - 1)); then select |acc| > threshold (strict).
//   sidco_e: exponential in every stage;  sidco_p: generalised Pareto in every stage;
//   sidco_gp: gamma in stage 1 (EC form, inverse incomplete gamma), generalised Pareto after.
// Adaptive stage count (mode -1): every 5 Selects, q = mean of (selected / (d n)) over them;
// q > 1.2: S - 1, q < 0.8: S + 1, clamped to [1, ceil(ln d / ln 0.5)].
// Statistics are on |acc| (every fit is scale-equivariant, so |acc| / ||acc|| selects the same);
// the exceedance location is the previous stage's threshold; variances are sample variances
// (n - 1); the gamma stage fits the non-zero magnitudes with its ratio raised to
// ratio * n / nonzeros; the stage state is per compressor instance.
// Passes: once a stage's survivors are expected to be few (1.5x the fit's target within
// max(4k, n/16)), they are listed in one pass and the later stages and the final selection read
// the list. With compact (the default), where two or more later stages would each read acc,
// stage 1's survivors are listed instead; a stage whose float threshold lies within 1e-10
// relative of a rounding boundary is redone pass-per-stage, so thresholds and selections equal
// compact=false's bit for bit (sidco_test). On device primitives the lists are in device
// scratch; only a list of few survivors and the final selection are copied back.
// Parameters: stages (initial S, default 2), adaptive (default true), compact (default true).
// Scalars: [0] threshold, [1] stages used, [2] passes over acc.
#include "kernels/compressors/sidco.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/compressors/device_scratch.h"
#include "kernels/compressors/factories.h"
#include "kernels/compressors/selection.h"
#include "kernels/compressors/stat_math.h"

namespace spex {
namespace {

inline constexpr double kFirstRatio = 0.25;
inline constexpr int kUpdateEvery = 5;
inline constexpr double kResDiff = 0.2;

// Relative distance from a float rounding boundary within which a threshold computed from the
// listed survivors' sums is not taken as the pass-per-stage one (their sums differ by ~1e-12
// relative at most on the tests' inputs).
inline constexpr double kRoundingMargin = 1e-10;

// Whether static_cast<float>(eta) could round the other way were eta off by kRoundingMargin.
bool NearRounding(double eta) {
  const float f = static_cast<float>(eta);
  if (!std::isfinite(f)) return false;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const double down = 0.5 * (static_cast<double>(f) + std::nextafter(f, -kInf));  // exact
  const double up = 0.5 * (static_cast<double>(f) + std::nextafter(f, kInf));
  const double margin = kRoundingMargin * std::fabs(eta);
  return eta - down < margin || up - eta < margin;
}

int MaxStages(double density) {
  return std::max(1, static_cast<int>(std::ceil(std::log(density) / std::log(0.5))));
}

class Sidco final : public Compressor {
 public:
  Sidco(const CompressorSpec& spec, Primitives* prims, SidcoFit fit, int stages, bool adaptive,
        bool compact)
      : Compressor(spec, prims),
        fit_(fit),
        stages_(stages),
        adaptive_(adaptive),
        compact_(compact),
        scratch_(prims),
        dev_(prims),
        pick_(prims) {}
  Pattern pattern() const override { return Pattern::kSparseGather; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    const size_t n = ctx.n;
    const double d = ctx.density;
    stages_ = std::min(std::max(stages_, 1), MaxStages(d));
    const bool single = stages_ == 1 || d >= kFirstRatio;
    const double r1 = single ? d : kFirstRatio;
    int passes = 1;
    double eta;
    if (fit_ == SidcoFit::kGammaGPareto) {
      // acc += add and the moments of the non-zero magnitudes, in one pass.
      const AbsMoments m = prims_->AccumulateMoments(acc, add, n, 0.0f, true);
      if (m.count == 0) {
        eta = 0;
      } else {
        const double ratio = std::min(1.0, r1 * n / m.count);
        eta = ratio >= 1 ? 0 : GammaThreshold(m.sum / m.count, m.sum_log / m.count, ratio);
      }
    } else {
      const AbsMoments m = prims_->AccumulateMoments(acc, add, n, -1.0f, false);  // acc += add
      const double mean = m.sum / n;
      const double var = n > 1 ? std::max(0.0, (m.sum_sq - m.sum * mean) / (n - 1)) : 0.0;
      eta = fit_ == SidcoFit::kExponential ? ExponentialThreshold(mean, r1)
                                           : GParetoThreshold(mean, var, r1);
    }
    int used = 1;
    SurvivorList list;
    if (!single) {
      const double eta1 = eta;
      if (!LaterStages(ctx, acc, compact_, &eta, &used, &passes, &list)) {
        eta = eta1;  // a stage's float threshold is not safely the pass-per-stage one's: redo
        used = 1;
        list = SurvivorList();
        LaterStages(ctx, acc, false, &eta, &used, &passes, &list);
      }
    }
    const float th = std::max(static_cast<float>(eta), kMinThreshold);
    if (list.have && th >= list.eta && list.dev) {
      // The final selection from the device list: positions in it, mapped to acc's indices on
      // the device; only the selected entries come back, and acc is zeroed from the device.
      const size_t base = out->idx.size();
      const size_t cap = std::min<size_t>(std::max<size_t>(2 * ctx.k, 1024), list.n);
      const uint32_t* at = FetchFromList(list, StrictAbove(th), cap, true, &out->idx, &out->val);
      if (zero && at != nullptr && out->idx.size() > base) {
        if (absl::Status st = prims_->ZeroAt(acc, n, at, out->idx.size() - base); !st.ok()) {
          return st;
        }
      }
    } else if (list.have && th >= list.eta) {
      const size_t base = out->idx.size();
      if (list.few) {
        for (size_t j = 0; j < list.n; ++j) {
          if (std::fabs(list.val[j]) > th) {
            out->idx.push_back(list.idx[j]);
            out->val.push_back(list.val[j]);
          }
        }
      } else {
        // Positions in the list, then their indices in acc.
        picked_.idx.clear();
        picked_.val.clear();
        AppendAbove(prims_, const_cast<float*>(list.val), nullptr, 0, list.n, StrictAbove(th),
                    false, 2 * ctx.k, &picked_);
        out->idx.resize(base + picked_.idx.size());
        for (size_t j = 0; j < picked_.idx.size(); ++j) {
          out->idx[base + j] = list.idx[picked_.idx[j]];
        }
        out->val.insert(out->val.end(), picked_.val.begin(), picked_.val.end());
      }
      if (zero && out->idx.size() > base) {
        if (absl::Status st = ZeroAtHost(prims_, acc, n, out->idx.data() + base,
                                         out->idx.size() - base, &scratch_);
            !st.ok()) {
          return st;
        }
      }
    } else {
      AppendAbove(prims_, acc, nullptr, 0, n, StrictAbove(th), zero, 2 * ctx.k, out, &scratch_);
      ++passes;
    }
    out->scalars[0] = th;
    out->scalars[1] = static_cast<float>(used);
    out->scalars[2] = static_cast<float>(passes);
    if (adaptive_) Adapt(static_cast<double>(out->idx.size()) / (d * n), d);
    if (scratch_.host()) return absl::OkStatus();
    absl::Status status;  // the first failure of the three scratches (all cleared)
    for (Scratch* s : {&dev_, &pick_, &scratch_}) {
      absl::Status st = s->TakeStatus();
      if (status.ok()) status = st;
    }
    return status;
  }

 private:
  // The survivors the later stages and the final selection read instead of acc: idx/val[0, n)
  // hold, ascending by index, every i with |acc[i]| > eta.
  struct SurvivorList {
    bool have = false;
    bool few = false;  // the list the pass-per-stage path collects too (the same entries)
    const uint32_t* idx = nullptr;
    const float* val = nullptr;
    size_t n = 0;
    float eta = 0;
    bool dev = false;  // idx/val are in device scratch (dev_'s slots kListIdx, kListVal)
  };

  // dev_'s slots: the device list; pick_'s: positions in it, their values, their indices in acc.
  static constexpr int kListIdx = 0, kListVal = 1;
  static constexpr int kPos = 0, kVal = 1, kIdx = 2;

  // On device primitives: the entries of the device list with |val| >= t, at most `cap` of them
  // (`grow`: all of them, with a second pass when more), appended to the host idx (acc's
  // indices) and val. Returns their indices in device scratch, or null where nothing was
  // appended (more than `cap` without `grow`, or a failure, kept in pick_).
  const uint32_t* FetchFromList(const SurvivorList& list, float t, size_t cap, bool grow,
                                std::vector<uint32_t>* idx, std::vector<float>* val) {
    cap = std::max<size_t>(cap, 1);
    auto* pos = static_cast<uint32_t*>(pick_.Get(kPos, cap * 4).value_or(nullptr));
    auto* v = static_cast<float*>(pick_.Get(kVal, cap * 4).value_or(nullptr));
    if (pos == nullptr || v == nullptr) return nullptr;
    float* list_val = const_cast<float*>(list.val);
    size_t c = prims_->SelectAbove(list_val, 0, list.n, t, false, pos, v, cap);
    if (c > cap) {
      if (!grow) return nullptr;
      cap = c;
      pos = static_cast<uint32_t*>(pick_.Get(kPos, cap * 4).value_or(nullptr));
      v = static_cast<float*>(pick_.Get(kVal, cap * 4).value_or(nullptr));
      if (pos == nullptr || v == nullptr) return nullptr;
      c = prims_->SelectAbove(list_val, 0, list.n, t, false, pos, v, cap);
    }
    auto* at =
        static_cast<uint32_t*>(pick_.Get(kIdx, std::max<size_t>(c, 1) * 4).value_or(nullptr));
    if (at == nullptr) return nullptr;
    // The list's index words moved as floats: Gather copies 32-bit words without arithmetic.
    if (absl::Status st = prims_->Gather(reinterpret_cast<const float*>(list.idx), list.n, pos, c,
                                         reinterpret_cast<float*>(at));
        !st.ok()) {
      pick_.Fail(st);
      return nullptr;
    }
    const size_t base = idx->size();
    idx->resize(base + c);
    val->resize(base + c);
    if (!pick_.Fetch(idx->data() + base, at, c * 4).ok() ||
        !pick_.Fetch(val->data() + base, v, c * 4).ok()) {
      idx->resize(base);
      val->resize(base);
      return nullptr;
    }
    return at;
  }

  // Stages 2..S from stage 1's threshold *eta (updated; *used and *passes counted on). With
  // `compact`, where two or more stages would each read acc, stage 1's survivors are listed once
  // and the stages' moments read that list. Those sums run in other lanes than a pass over acc
  // and may differ in the last bits, so a stage whose threshold lies within kRoundingMargin of
  // a float rounding boundary returns false: the caller redoes the stages without `compact`.
  bool LaterStages(const StepContext& ctx, float* acc, bool compact, double* eta, int* used,
                   int* passes, SurvivorList* list) {
    const size_t n = ctx.n;
    const double rho = std::pow(ctx.density / kFirstRatio, 1.0 / (stages_ - 1));
    const size_t cap = std::max<size_t>(4 * ctx.k, n / 16);
    int full_stages = 0;  // stages that the pass-per-stage path fits with a pass over acc
    double expected = kFirstRatio * n;  // survivors above eta, as the fits aim
    for (int s = 1; s < stages_; ++s, expected *= rho) full_stages += 1.5 * expected > cap;
    bool try_compact = compact && full_stages >= 2;
    const bool listed = try_compact;
    expected = kFirstRatio * n;
    for (int s = 1; s < stages_; ++s) {
      const float lb = static_cast<float>(*eta);
      const bool few = 1.5 * expected <= cap;
      if (list->have && !(lb >= list->eta)) *list = SurvivorList();  // (eta never falls)
      if (!list->have && (try_compact || few)) {
        // Stage 1's survivors (about a quarter of acc) once, or few survivors: collected in one
        // pass; this and the later stages and the final selection then read the list.
        const size_t want = try_compact ? std::max(cap, n / 8 * 3) : cap;
        try_compact = false;
        if (!scratch_.host()) {
          CollectOnDevice(acc, n, lb, want, few, cap, list);
          ++*passes;
        } else {
          if (list_idx_.size() < want) {
            list_idx_.resize(want);
            list_val_.resize(want);
          }
          const size_t c = prims_->SelectAbove(acc, 0, n, StrictAbove(lb), false, list_idx_.data(),
                                               list_val_.data(), want);
          ++*passes;
          if (c <= want) *list = {true, few && c <= cap, list_idx_.data(), list_val_.data(), c, lb};
        }
      } else if (list->have && !list->few && few && list->dev) {
        // As below, from the device list; the cut (at most cap entries) comes back.
        few_idx_.clear();
        few_val_.clear();
        if (FetchFromList(*list, StrictAbove(lb), cap, false, &few_idx_, &few_val_) != nullptr) {
          *list = {true, true, few_idx_.data(), few_val_.data(), few_idx_.size(), lb};
        }
      } else if (list->have && !list->few && few) {
        // Where the pass-per-stage path collects its list, cut this one to the same entries.
        if (few_idx_.size() < cap) {
          few_idx_.resize(cap);
          few_val_.resize(cap);
        }
        const size_t c =
            prims_->SelectAbove(const_cast<float*>(list->val), 0, list->n, StrictAbove(lb), false,
                                few_idx_.data(), few_val_.data(), cap);
        if (c <= cap) {
          for (size_t j = 0; j < c; ++j) few_idx_[j] = list->idx[few_idx_[j]];
          *list = {true, true, few_idx_.data(), few_val_.data(), c, lb};
        }
      }
      AbsMoments y;
      if (list->have && list->few) {
        for (size_t j = 0; j < list->n; ++j) {
          const float a = std::fabs(list->val[j]);
          if (!(a > lb)) continue;
          y.count++;
          y.sum += a;
          y.sum_sq += static_cast<double>(a) * a;
        }
      } else if (list->have) {  // (read only: with no addend nothing is stored)
        y = prims_->AccumulateMoments(const_cast<float*>(list->val), nullptr, list->n, lb, false);
      } else {
        y = prims_->AccumulateMoments(acc, nullptr, n, lb, false);  // (no logs needed)
        ++*passes;
      }
      if (y.count < 2) break;
      const double mean_y = y.sum / y.count;
      const double var = std::max(0.0, (y.sum_sq - y.sum * mean_y) / (y.count - 1));
      const double mean_z = std::max(0.0, mean_y - *eta);
      *eta += fit_ == SidcoFit::kExponential ? ExponentialThreshold(mean_z, rho)
                                             : GParetoThreshold(mean_z, var, rho);
      expected *= rho;
      ++*used;
      if (listed && NearRounding(*eta)) return false;
    }
    return true;
  }

  // On device primitives: every i with |acc[i]| > lb, into dev_ when at most `want`; a list of
  // few (at most cap, where `few`) comes back to the host vectors, as the host loops read it.
  void CollectOnDevice(float* acc, size_t n, float lb, size_t want, bool few, size_t cap,
                       SurvivorList* list) {
    auto* idx =
        static_cast<uint32_t*>(dev_.Get(kListIdx, std::max<size_t>(want, 1) * 4).value_or(nullptr));
    auto* val =
        static_cast<float*>(dev_.Get(kListVal, std::max<size_t>(want, 1) * 4).value_or(nullptr));
    if (idx == nullptr || val == nullptr) return;
    const size_t c = prims_->SelectAbove(acc, 0, n, StrictAbove(lb), false, idx, val, want);
    if (c > want) return;
    if (!(few && c <= cap)) {
      *list = {true, false, idx, val, c, lb, true};
      return;
    }
    if (list_idx_.size() < c) {
      list_idx_.resize(c);
      list_val_.resize(c);
    }
    if (dev_.Fetch(list_idx_.data(), idx, c * 4).ok() &&
        dev_.Fetch(list_val_.data(), val, c * 4).ok()) {
      *list = {true, true, list_idx_.data(), list_val_.data(), c, lb};
    }
  }

  bool SaveOwnState(StateWriter* w) const override {
    if (w) {
      w->Put<int32_t>(stages_);
      w->Put(q_sum_);
      w->Put<int32_t>(q_calls_);
    }
    return true;
  }
  bool LoadOwnState(StateReader& r) override {
    int32_t stages, calls;
    double q_sum;
    if (!r.Get(&stages) || !r.Get(&q_sum) || !r.Get(&calls) || !r.complete()) return false;
    if (stages < 1 || stages > 32 || calls < 0 || calls >= kUpdateEvery) return false;
    stages_ = stages;
    q_sum_ = q_sum;
    q_calls_ = calls;
    return true;
  }

  void Adapt(double q, double d) {
    q_sum_ += q;
    if (++q_calls_ < kUpdateEvery) return;
    const double mean_q = q_sum_ / q_calls_;
    if (mean_q > 1 + kResDiff)
      --stages_;
    else if (mean_q < 1 - kResDiff)
      ++stages_;
    stages_ = std::min(std::max(stages_, 1), MaxStages(d));
    q_sum_ = 0;
    q_calls_ = 0;
  }

  SidcoFit fit_;
  // Scratch, kept between calls (sized as needed, never shrunk): the survivor list, the few
  // survivors cut from it, and the positions the final selection picks from it.
  std::vector<uint32_t> list_idx_, few_idx_;
  std::vector<float> list_val_, few_val_;
  Selection picked_;
  int stages_;
  bool adaptive_;
  bool compact_;
  double q_sum_ = 0;
  int q_calls_ = 0;
  // Device primitives only: the helpers' scratch, the device list, the picks from it.
  Scratch scratch_, dev_, pick_;
};

}  // namespace

std::unique_ptr<Compressor> MakeSidco(const CompressorSpec& spec, Primitives* prims, ParamReader& r,
                                      SidcoFit fit) {
  const int stages = static_cast<int>(
      r.Int("stages", 2, 1, 32, "initial number of stages (clamped to ceil(ln d / ln 0.5))"));
  const bool adaptive =
      r.Bool("adaptive", true, "adapt the stage count every 5 steps (+-20% band)");
  const bool compact = r.Bool("compact", true,
                              "fit stages 2.. on a list of stage 1's survivors (false: a pass "
                              "over acc per stage; the same thresholds)");
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<Sidco>(spec, prims, fit, stages, adaptive, compact);
}

}  // namespace spex
