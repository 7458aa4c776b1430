// exdyna (pattern A; Yoon & Oh, CCGrid 2024; docs/algorithms.md#exdyna): MiCRO's exclusive cyclic
// selection over partitions made of 1024 blocks whose boundaries move one block at a time toward
// the heavier of two adjacent partitions, using the counts every node gathered last step (no
// extra communication). Parameters: threshold_control=reference|histogram (default histogram),
// histogram_trim (as micro).
// The reference controller is MiCRO's rule with one global threshold; the
// histogram quota of every partition is k / nodes (the balanced share ExDyna's allocation aims
// at), so with histogram control a boundary moves only when a partition cannot fill its quota
// (too few non-zero entries) or misses it by more than 5%; an empty partition sends nothing; the
// avg == 0 case makes no moves.
#include "kernels/compressors/exdyna.h"

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/compressors/factories.h"
#include "kernels/compressors/selection.h"
#include "kernels/compressors/threshold_control.h"

namespace spex {

absl::StatusOr<ExDynaLayout> ExDynaLayout::Make(size_t n, int parts) {
  ExDynaLayout l;
  l.n_ = n;
  l.parts_ = parts;
  l.num_blocks_ = std::min(kExDynaBlocks, n);
  if (l.num_blocks_ < static_cast<size_t>(parts)) {
    return absl::InvalidArgumentError(absl::StrCat("exdyna: ", n, " elements give ", l.num_blocks_,
                                                   " blocks, fewer than the ", parts, " nodes"));
  }
  const size_t a0 = n / l.num_blocks_;
  l.blk_ = a0 >= 32 ? a0 - a0 % 32 : a0;
  l.rem_ = n - l.blk_ * l.num_blocks_;
  l.min_blk_ = static_cast<double>(l.num_blocks_) / (4.0 * parts);
  l.blocks_.resize(parts);
  l.pos_.resize(parts);
  int64_t pos = 0;
  for (int j = 0; j < parts; ++j) {
    l.blocks_[j] = static_cast<int64_t>(l.num_blocks_ / parts +
                                        (static_cast<size_t>(j) < l.num_blocks_ % parts ? 1 : 0));
    l.pos_[j] = pos;
    pos += l.blocks_[j];
  }
  return l;
}

Range ExDynaLayout::Partition(int j) const {
  Range r;
  r.begin = static_cast<size_t>(pos_[j]) * blk_;
  r.end = static_cast<size_t>(pos_[j] + blocks_[j]) * blk_ + (j == parts_ - 1 ? rem_ : 0);
  return r;
}

int ExDynaLayout::Allocate(std::vector<int64_t> pc, uint64_t k_prev) {
  const int64_t avg = static_cast<int64_t>(k_prev / parts_);
  if (avg == 0) return 0;
  const double dens = static_cast<double>(k_prev) / n_;
  const int64_t mv = static_cast<int64_t>(blk_ * dens);
  int moves = 0;
  for (int i = 0; i + 1 < parts_; ++i) {
    const double hi = static_cast<double>(pc[i]) / avg, hj = static_cast<double>(pc[i + 1]) / avg;
    if (hi > kExDynaHeavy && hj < kExDynaLight) {
      if (blocks_[i] - 1 < min_blk_) continue;
      blocks_[i] -= 1;
      blocks_[i + 1] += 1;
      pos_[i + 1] -= 1;
      pc[i] -= mv;
      pc[i + 1] += mv;
      ++moves;
    } else if (hi < kExDynaLight && hj > kExDynaHeavy) {
      if (blocks_[i + 1] - 1 < min_blk_) continue;
      blocks_[i] += 1;
      blocks_[i + 1] -= 1;
      pos_[i + 1] += 1;
      pc[i] += mv;
      pc[i + 1] -= mv;
      ++moves;
    }
  }
  return moves;
}

void ExDynaLayout::Save(StateWriter* w) const {
  w->PutVector(blocks_);
  w->PutVector(pos_);
}

bool ExDynaLayout::Load(StateReader& r) {
  std::vector<int64_t> blocks, pos;
  if (!r.GetVector(&blocks, parts_) || !r.GetVector(&pos, parts_)) return false;
  if (blocks.size() != static_cast<size_t>(parts_) || pos.size() != blocks.size()) return false;
  int64_t next = 0;
  for (int j = 0; j < parts_; ++j) {
    if (pos[j] != next || blocks[j] < 0) return false;
    next += blocks[j];
  }
  if (next != static_cast<int64_t>(num_blocks_)) return false;
  blocks_ = std::move(blocks);
  pos_ = std::move(pos);
  return true;
}

namespace {

class ExDyna final : public Compressor {
 public:
  ExDyna(const CompressorSpec& spec, Primitives* prims, ExDynaLayout layout,
         ThresholdControl control, bool trim)
      : Compressor(spec, prims),
        layout_(std::move(layout)),
        control_(control),
        trim_(trim),
        scratch_(prims) {}
  Pattern pattern() const override { return Pattern::kIndexUnion; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool,
                        Selection* out) override {
    const int part = OwnedPartition(ctx.step, ctx.node_rank, ctx.node_count);
    const Range r = layout_.Partition(part);
    float used;
    if (control_ == ThresholdControl::kReference) {
      th_ = ctx.call == 0 ? InitialThreshold(ctx.k)
                          : static_cast<float>(
                                th_ * ReferenceScaleFactor(static_cast<double>(k_prev_) / ctx.k));
      AccumulateOutside(prims_, acc, add, ctx.n, r.begin, r.end);
      AppendAbove(prims_, acc, add, r.begin, r.end, th_, false, 2 * (ctx.k / ctx.node_count), out,
                  &scratch_);
      used = th_;
    } else {
      if (add) prims_->Accumulate(acc, add, ctx.n);
      used =
          HistogramQuotaSelect(prims_, acc, r.begin, r.end, EvenShare(ctx.k, ctx.node_count, part),
                               trim_, &bins_, out, &scratch_, &edge_hint_);
    }
    out->scalars[0] = used;
    out->scalars[1] = static_cast<float>(part);
    out->scalars[2] = static_cast<float>(r.size());
    return scratch_.TakeStatus();
  }

  absl::Status DoUpdate(const StepContext& ctx, const Gathered& g) override {
    const int n = ctx.node_count;
    std::vector<int64_t> pc(n);
    k_prev_ = 0;
    for (int r = 0; r < n; ++r) {
      pc[OwnedPartition(ctx.step, r, n)] = static_cast<int64_t>(g.counts[r]);
      k_prev_ += g.counts[r];
    }
    layout_.Allocate(std::move(pc), k_prev_);
    return absl::OkStatus();
  }

  bool SaveOwnState(StateWriter* w) const override {
    if (w) {
      SaveThresholdState(w, th_, k_prev_, edge_hint_);
      layout_.Save(w);
    }
    return true;
  }
  bool LoadOwnState(StateReader& r) override {
    float th;
    uint64_t k_prev;
    uint32_t edge;
    ExDynaLayout layout = layout_;
    if (!LoadThresholdState(r, &th, &k_prev, &edge) || !layout.Load(r) || !r.complete()) {
      return false;
    }
    th_ = th;
    k_prev_ = k_prev;
    edge_hint_ = edge;
    layout_ = std::move(layout);
    return true;
  }

 private:
  ExDynaLayout layout_;
  ThresholdControl control_;
  bool trim_;
  float th_ = 0;
  uint64_t k_prev_ = 1;
  std::vector<uint32_t> bins_;
  uint32_t edge_hint_ = 0;  // the last histogram edge bin (HistogramQuotaSelect's hint)
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Compressor> MakeExDyna(const CompressorSpec& spec, Primitives* prims,
                                       ParamReader& r) {
  bool trim;
  const ThresholdControl control = ReadThresholdControl(r, &trim);
  if (prims == nullptr || !r.ok()) return nullptr;
  absl::StatusOr<ExDynaLayout> layout = ExDynaLayout::Make(spec.elements, spec.node_count);
  if (!layout.ok()) {
    r.Reject(std::string(layout.status().message()));
    return nullptr;
  }
  return std::make_unique<ExDyna>(spec, prims, std::move(*layout), control, trim);
}

}  // namespace spex
