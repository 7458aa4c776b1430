// MiCRO (Yoon & Oh, HiPC 2023; docs/algorithms.md#micro): every node selects only inside the
// partition it owns this step (cyclic, exclusive), so there is no gradient build-up; pattern A.
// Parameters: threshold_control=reference|histogram (default histogram;
// docs/algorithms.md#threshold-control), histogram_trim=true|false (cut the histogram's candidates
// to the exact quota). Where the reference is silent or buggy:
//  - K_prev is the sum of the gathered counts (the own count on a single node: no endless decay);
//  - an empty partition sends nothing (the reference sends one dummy index; counts are always
//    exchanged in spex, so an empty selection is legal);
//  - the histogram quota of partition p is k / nodes (remainder to the lowest partitions);
//  - the ownership cycle follows the engine's step, the controller's t = 0 is the first Select.
#include "kernels/compressors/micro.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/compressors/factories.h"
#include "kernels/compressors/selection.h"
#include "kernels/compressors/threshold_control.h"

namespace spex {

Range EqualPartition(size_t n, int parts, int j) {
  const size_t q = n / parts, r = n % parts, uj = static_cast<size_t>(j);
  Range p;
  p.begin = uj * q + std::min(uj, r);
  p.end = p.begin + q + (uj < r ? 1 : 0);
  return p;
}

int OwnedPartition(uint64_t step, int rank, int nodes) {
  return static_cast<int>((step % nodes + static_cast<uint64_t>(rank)) % nodes);
}

namespace {

// How far below the partition's hint the local sum counts its histogram: 128 bins, a factor 2 in
// magnitude, where the selection's own count starts 32 below. In the sum's pass an entry below
// the start costs one compare (its value is at hand), an entry above it an increment, and a count
// that falls short a pass of its own. On micro@0.1's CNN bucket a partition's edge moved by up to
// 340 bins down and 520 up between two of its selections, and lay more than 32 bins below the
// hint in 64% of them, more than 128 in 22% (docs/algorithms.md §5.2).
constexpr uint32_t kSumCountMargin = 128;

class Micro final : public Compressor {
 public:
  Micro(const CompressorSpec& spec, Primitives* prims, ThresholdControl control, bool trim)
      : Compressor(spec, prims), control_(control), trim_(trim), scratch_(prims) {}
  Pattern pattern() const override { return Pattern::kIndexUnion; }

  // The partition owned at `step`, from its hint's start bin on, into bins_ (docs/algorithms.md
  // §5.2): the local sum counts it as it writes acc, and Select walks the counts.
  SumHistogram* PlanSumHistogram(uint64_t step) override {
    if (control_ != ThresholdControl::kHistogram || prims_->device() != Device::kCpu) {
      return nullptr;
    }
    const int part = OwnedPartition(step, node_rank(), node_count());
    const Range r = EqualPartition(elements(), node_count(), part);
    bins_.assign(Primitives::kHistogramBins, 0);
    plan_.step = step;
    plan_.range.begin = r.begin;
    plan_.range.end = r.end;
    plan_.range.first_bin = HistogramCountStart(&HintFor(part), kSumCountMargin);
    plan_.range.bins = bins_.data();
    plan_.counted = false;
    return &plan_;
  }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool,
                        Selection* out) override {
    const int part = OwnedPartition(ctx.step, ctx.node_rank, ctx.node_count);
    const Range r = EqualPartition(ctx.n, ctx.node_count, part);
    float used;
    if (control_ == ThresholdControl::kReference) {
      if (ctx.call == 0) {
        th_ = InitialThreshold(ctx.k);
      } else {
        th_ = static_cast<float>(
            th_ * ReferenceScaleFactor(static_cast<double>(k_prev_) / static_cast<double>(ctx.k)));
      }
      AccumulateOutside(prims_, acc, add, ctx.n, r.begin, r.end);
      AppendAbove(prims_, acc, add, r.begin, r.end, th_, false, 2 * (ctx.k / ctx.node_count), out,
                  &scratch_);
      used = th_;
    } else {
      if (add) prims_->Accumulate(acc, add, ctx.n);
      uint32_t& hint = HintFor(part);
      // The counts of this step's sum, where it counted this range.
      const bool counted = plan_.counted && add == nullptr && plan_.step == ctx.step &&
                           plan_.range.begin == r.begin && plan_.range.end == r.end &&
                           plan_.range.bins == bins_.data();
      plan_.counted = false;
      used = HistogramQuotaSelect(prims_, acc, r.begin, r.end,
                                  EvenShare(ctx.k, ctx.node_count, part), trim_, &bins_, out,
                                  &scratch_, &hint, counted ? plan_.range.first_bin : kNotCounted);
      edge_hint_ = hint;  // the one a checkpoint keeps
    }
    out->scalars[0] = used;
    out->scalars[1] = static_cast<float>(part);
    return scratch_.TakeStatus();
  }

  absl::Status DoUpdate(const StepContext&, const Gathered& g) override {
    k_prev_ = 0;
    for (uint64_t c : g.counts) k_prev_ += c;
    return absl::OkStatus();
  }

  bool SaveOwnState(StateWriter* w) const override {
    if (w) SaveThresholdState(w, th_, k_prev_, edge_hint_);
    return true;
  }
  bool LoadOwnState(StateReader& r) override {
    float th;
    uint64_t k_prev;
    uint32_t edge;
    if (!LoadThresholdState(r, &th, &k_prev, &edge) || !r.complete()) return false;
    th_ = th;
    k_prev_ = k_prev;
    edge_hint_ = edge;
    edge_hints_.clear();  // every partition starts from the saved hint
    plan_.counted = false;
    return true;
  }

 private:
  // One hint per partition: the partition owned changes every step, and the edge of the one
  // owned last step is a poor start for another's (about half of the CNN bucket's hints fell
  // short of the edge and took a second count). The hint only says where counting starts; the
  // edge found is the same from any hint.
  uint32_t& HintFor(int part) {
    if (edge_hints_.size() != static_cast<size_t>(node_count())) {
      edge_hints_.assign(static_cast<size_t>(node_count()), edge_hint_);
    }
    return edge_hints_[static_cast<size_t>(part)];
  }

  ThresholdControl control_;
  bool trim_;
  float th_ = 0;
  uint64_t k_prev_ = 1;
  std::vector<uint32_t> bins_;
  uint32_t edge_hint_ = 0;            // the last histogram edge bin (HistogramQuotaSelect's hint)
  std::vector<uint32_t> edge_hints_;  // the last edge bin of each partition (node_count of them)
  SumHistogram plan_;                 // PlanSumHistogram's, into bins_
  Scratch scratch_;
};

}  // namespace

ThresholdControl ReadThresholdControl(ParamReader& r, bool* trim) {
  const std::string c = r.Choice("threshold_control", "histogram", {"reference", "histogram"},
                                 "published multiplicative controller, or spex's per-partition "
                                 "histogram quota");
  *trim = r.Bool("histogram_trim", true,
                 "histogram control: cut the candidates to the exact quota (top-quota)");
  return c == "reference" ? ThresholdControl::kReference : ThresholdControl::kHistogram;
}

std::unique_ptr<Compressor> MakeMicro(const CompressorSpec& spec, Primitives* prims,
                                      ParamReader& r) {
  bool trim;
  const ThresholdControl control = ReadThresholdControl(r, &trim);
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<Micro>(spec, prims, control, trim);
}

}  // namespace spex
