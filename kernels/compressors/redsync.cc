// redsync and redsync_trim (pattern B; docs/algorithms.md#redsync, SIDCo's RedSyncCompressor and
// RedSyncTrimCompressor): on |acc|, mean and max, then a search for th = mean + r (max - mean)
// (see threshold_search.h for the exact rules), then select |acc| > th.
//  - redsync: the published binary search over r (at most 3 probes: it stops once the interval is
//    no wider than 0.2) aims at k < count < 2k. On heavy-tailed gradients max is an outlier far
//    above the k-th magnitude, so the 3 probes (r = 0.5, 0.25, 0.125) all select far fewer than k
//    and the count does not depend on k at all. With search=band (spex's default) the search
//    goes on bisecting th between the closest probes on either side of the band until the count
//    is inside it (at most 40 probes; the published result is kept whenever it is inside);
//    search=reference stops where the reference does. The published rule moves the lower bound
//    up for k/2 <= count <= k as well (the threshold rises although the count is already low);
//    both searches keep it for the published probes.
//  - redsync_trim: r = 0.8, 0.6, ..., 0.0 until at least k entries exceed th. The steps are so
//    coarse that on heavy tails the search ends at r = 0 (th = mean, about a third of all
//    entries). With trim=true (spex's default) the candidates above th are trimmed to their exact
//    top-k (RedSync's trimmed top-k; it is the exact top-k of acc, since at least k entries
//    exceed th); trim=false sends every candidate, as the reference.
// The default modes count their probes on a magnitude histogram (one pass; see CutCount), which
// gives the same decisions as exact counts; the reference modes count each probe in a pass.
// Parameters: redsync: search=band|reference; redsync_trim: trim=true|false.
// Scalars: [0] threshold of the search (redsync_trim: the candidates' threshold), [1] probes,
// [2] passes over acc.
#include "kernels/compressors/redsync.h"

#include <algorithm>
#include <memory>
#include <string>

#include "kernels/compressors/device_scratch.h"
#include "kernels/compressors/factories.h"
#include "kernels/compressors/magnitude_histogram.h"
#include "kernels/compressors/selection.h"
#include "kernels/compressors/threshold_scanner.h"
#include "kernels/compressors/threshold_search.h"

namespace spex {
namespace {

class RedSync final : public StatelessCompressor {
 public:
  // trim: redsync_trim; band: redsync's band search, or redsync_trim's trim to the top-k.
  RedSync(const CompressorSpec& spec, Primitives* prims, bool trim, bool band)
      : StatelessCompressor(spec, prims), trim_(trim), band_(band), scratch_(prims) {}
  Pattern pattern() const override { return Pattern::kSparseGather; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    const size_t n = ctx.n, k = ctx.k;
    const AbsMoments m = prims_->AccumulateMoments(acc, add, n, -1.0f, false);  // acc += add
    const double mean = m.sum / n, max = m.max;
    int passes = 1;  // the moments
    ThresholdScanner scan(prims_, acc, nullptr, n, 2 * k, &scratch_);
    const CountFn exact = [&](float t) { return scan.Count(t); };
    const BoundsFn bounds = [this](float t, size_t* lo, size_t* hi) { hist_.Bounds(t, lo, hi); };
    CountFn count = exact;
    if (band_) {
      // Up to 40 probes (or 5 and a trim): answered from one histogram pass, exactly only where
      // the bin holding a probe straddles a count the search compares with. Every probe is at
      // or above the mean, so the histogram covers the magnitudes from the mean's bin up.
      hist_.BuildFrom(prims_, acc, n, static_cast<float>(mean), &scratch_);
      ++passes;
      count = CutCount(bounds, trim_ ? RedSyncTrimCuts(k) : RedSyncCuts(k), exact);
    }
    auto probe = [&](float t) { return count(StrictAbove(std::max(t, kMinThreshold))); };
    int probes = 0;
    float th;
    if (trim_) {
      th = RedSyncTrimSearch(mean, max, k, probe, &probes);
    } else if (band_) {
      th = RedSyncBandSearch(mean, max, k, probe, &probes);
    } else {
      th = RedSyncSearch(mean, max, k, probe, &probes);
    }
    th = std::max(th, kMinThreshold);
    out->idx.clear();
    out->val.clear();
    if (trim_ && band_ && CutCount(bounds, {k + 1.0}, exact)(StrictAbove(th)) > k) {
      // The exact top-k of the candidates (more than k exceed th) is the exact top-k of acc. It
      // is taken from the entries at or above the histogram's bin that the k-th magnitude lies
      // in (everything below ranks below k of them; ties keep index order): one select pass and
      // a top-k of about k entries.
      const float floor = hist_.FloorOfTop(k);
      if (floor > 0) {
        size_t lo, hi;
        hist_.Bounds(floor, &lo, &hi);
        AppendAbove(prims_, acc, nullptr, 0, n, floor, false, hi, out, &scratch_);
        TrimTopK(prims_, out, 0, k, &scratch_);
        if (zero && !out->idx.empty()) {
          if (absl::Status s =
                  ZeroAtHost(prims_, acc, n, out->idx.data(), out->idx.size(), &scratch_);
              !s.ok()) {
            return s;
          }
        }
      } else {
        AppendTopK(prims_, acc, 0, n, k, zero, out, &scratch_);
      }
      ++passes;
    } else {
      scan.Select(StrictAbove(th), zero, out);
    }
    out->scalars[0] = th;
    out->scalars[1] = static_cast<float>(probes);
    out->scalars[2] = static_cast<float>(scan.passes() + passes);
    return scratch_.TakeStatus();
  }

 private:
  bool trim_;
  bool band_;
  MagnitudeHistogram hist_;
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Compressor> NewRedSync(const CompressorSpec& spec, Primitives* prims, bool trim,
                                       bool band) {
  return std::make_unique<RedSync>(spec, prims, trim, band);
}

std::unique_ptr<Compressor> MakeRedSync(const CompressorSpec& spec, Primitives* prims,
                                        ParamReader& r) {
  const std::string search =
      r.Choice("search", "band", {"band", "reference"},
               "band: search until k < count < 2k; reference: stop after the published probes");
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<RedSync>(spec, prims, false, search == "band");
}

}  // namespace spex
