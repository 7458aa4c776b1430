// deft (pattern A; Yoon & Oh, ICPP 2023; docs/algorithms.md#deft): the vector is cut into units; k
// is allocated over the units by their norms (descending: k_u = floor(k_rem ||a_u|| / norm_rem),
// clipped to [1, size_u]); the units are bin-packed into one bin per node (costliest unit into
// the lightest bin, cost size_u log2(k_u), or size_u when k_u <= 1; units with k_u == size_u form
// the common part, sent in full by every node); node r takes bin (step mod nodes + r) mod nodes
// and selects the exact top-k_u inside each of its units.
// Choices (the reference needs tensor boundaries and a broadcast from the step's leader, which a
// flat bucket and one gather per step do not have):
//  - units are `units_per_node * nodes` contiguous near-equal chunks of the bucket;
//  - the bin packing every node must agree on uses the per-unit counts of the previous step's
//    gathered union (identical on every node; at the first step, shares proportional to size);
//  - the k_u a node selects in its own units come from its own unit norms (DEFT's rule), so the
//    node total is near k, not exactly k.
// Parameters: units_per_node (default 8). Scalars: [0] units owned, [1] bin index.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "kernels/compressors/factories.h"
#include "kernels/compressors/micro.h"
#include "kernels/compressors/selection.h"

namespace spex {
namespace {

class Deft final : public Compressor {
 public:
  Deft(const CompressorSpec& spec, Primitives* prims, int units_per_node)
      : Compressor(spec, prims), scratch_(prims) {
    const size_t u =
        std::min<size_t>(spec.elements, static_cast<size_t>(units_per_node) * spec.node_count);
    for (size_t j = 0; j < u; ++j)
      units_.push_back(EqualPartition(spec.elements, static_cast<int>(u), static_cast<int>(j)));
    shared_k_.assign(u, -1);  // -1: no gathered union yet
  }
  Pattern pattern() const override { return Pattern::kIndexUnion; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool,
                        Selection* out) override {
    if (add) prims_->Accumulate(acc, add, ctx.n);
    const size_t u = units_.size();
    // Own allocation of k by unit norms, in descending norm order.
    std::vector<double> norm(u);
    double norm_rem = 0;
    for (size_t j = 0; j < u; ++j) {
      norm[j] = std::sqrt(prims_->Moments(acc + units_[j].begin, units_[j].size(), -1.0f).sum_sq);
      norm_rem += norm[j];
    }
    std::vector<size_t> order(u);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return norm[a] > norm[b]; });
    std::vector<size_t> own_k(u);
    double k_rem = static_cast<double>(ctx.k);
    for (size_t j : order) {
      double kj = norm_rem > 0 ? std::floor(k_rem * norm[j] / norm_rem) : 0;
      if (!(kj >= 1)) kj = 1;  // also NaN, from an infinite or NaN norm (found by compressor_fuzz)
      kj = std::min(kj, static_cast<double>(units_[j].size()));
      own_k[j] = static_cast<size_t>(kj);
      k_rem = std::max(0.0, k_rem - kj);
      norm_rem -= norm[j];
    }
    // The bins every node agrees on.
    const std::vector<int> bin_of = PackBins(ctx);
    const int my_bin = OwnedPartition(ctx.step, ctx.node_rank, ctx.node_count);
    int owned = 0;
    for (size_t j = 0; j < u; ++j) {
      const bool common = SharedK(j, ctx) >= static_cast<double>(units_[j].size());
      if (!common && bin_of[j] != my_bin) continue;
      ++owned;
      const size_t kj = common ? units_[j].size() : own_k[j];
      AppendTopK(prims_, acc, units_[j].begin, units_[j].end, kj, false, out, &scratch_);
    }
    out->scalars[0] = static_cast<float>(owned);
    out->scalars[1] = static_cast<float>(my_bin);
    return scratch_.TakeStatus();
  }

  absl::Status DoUpdate(const StepContext&, const Gathered& g) override {
    std::fill(shared_k_.begin(), shared_k_.end(), 0);
    size_t j = 0;
    for (uint32_t i : g.indices) {  // the union is sorted
      while (i >= units_[j].end) ++j;
      ++shared_k_[j];
    }
    return absl::OkStatus();
  }

  bool SaveOwnState(StateWriter* w) const override {
    if (w) w->PutVector(shared_k_);
    return true;
  }
  bool LoadOwnState(StateReader& r) override {
    std::vector<int64_t> shared;
    if (!r.GetVector(&shared, shared_k_.size()) || !r.complete()) return false;
    if (shared.size() != shared_k_.size()) return false;
    for (size_t j = 0; j < shared.size(); ++j) {
      if (shared[j] < -1 || shared[j] > static_cast<int64_t>(units_[j].size())) return false;
    }
    shared_k_ = std::move(shared);
    return true;
  }

 private:
  double SharedK(size_t j, const StepContext& ctx) const {
    if (shared_k_[j] >= 0) return static_cast<double>(shared_k_[j]);
    return std::max(1.0, std::floor(static_cast<double>(ctx.k) * units_[j].size() / ctx.n));
  }

  // Longest-processing-time packing of the non-common units into node_count bins.
  std::vector<int> PackBins(const StepContext& ctx) const {
    const size_t u = units_.size();
    std::vector<double> cost(u);
    for (size_t j = 0; j < u; ++j) {
      const double kj = SharedK(j, ctx), size = static_cast<double>(units_[j].size());
      cost[j] = kj >= size ? 0 : (kj <= 1 ? size : size * std::log2(kj));
    }
    std::vector<size_t> order(u);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return cost[a] > cost[b]; });
    std::vector<double> load(ctx.node_count, 0);
    std::vector<int> bin_of(u, -1);
    for (size_t j : order) {
      const int b = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      bin_of[j] = b;
      load[b] += cost[j];
    }
    return bin_of;
  }

  std::vector<Range> units_;
  std::vector<int64_t> shared_k_;
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Compressor> MakeDeft(const CompressorSpec& spec, Primitives* prims,
                                     ParamReader& r) {
  const int upn =
      static_cast<int>(r.Int("units_per_node", 8, 1, 1024, "units (contiguous chunks) per node"));
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<Deft>(spec, prims, upn);
}

}  // namespace spex
