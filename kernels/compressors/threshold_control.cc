// MiCRO's and ExDyna's threshold controllers (threshold_control.h).
#include "kernels/compressors/threshold_control.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/compressors/device_scratch.h"
#include "kernels/compressors/selection.h"

namespace spex {

double ReferenceScaleFactor(double ratio) {
  if (ratio > kRefBand) return kRefUpFactor;
  if (ratio > 1.0 / kRefBand) return kRefCreepFactor;
  return kRefDownFactor;
}

float InitialThreshold(size_t k) {
  return static_cast<float>(1.0 / (2.0 * std::sqrt(static_cast<double>(std::max<size_t>(k, 1)))));
}

size_t EvenShare(size_t k, int parts, int part) {
  const size_t q = k / parts, r = k % parts;
  return q + (static_cast<size_t>(part) < r ? 1 : 0);
}

namespace {

// The top-`quota` of [begin, end) when the edge bin b (magnitudes [edge, next)) holds more than
// the whole quota: appends exactly what AppendAbove at `edge` followed by TrimTopK would keep and
// returns true, or returns false with out unchanged when the edge bin holds more than one
// magnitude. `above` entries lie in higher bins. TrimTopK keeps every entry >= next and, of the
// edge bin's entries, the largest with ties toward the lower index; when the edge bin is a single
// magnitude v that is its first `quota - above` entries in index order. Without this a constant
// or few-valued bucket copied all n entries and ranked them (issue 12: 20x the usual time).
// Host primitives only: four scans of the range at most, about quota entries written.
bool SingleMagnitudeEdge(Primitives* p, float* acc, size_t begin, size_t end, float edge,
                         float next, size_t above, size_t in_edge, size_t quota, Selection* out) {
  const size_t from = out->idx.size();
  const size_t r = quota - above;  // >= 1: the loop stopped at b because above < quota
  out->idx.resize(from + quota);
  out->val.resize(from + quota);
  // The first `quota` entries >= edge: at least r of them are in the edge bin unless more than
  // `above` entries precede, which cannot be (only `above` are outside it).
  (void)p->SelectAbove(acc, begin, end, edge, false, out->idx.data() + from, out->val.data() + from,
                       quota);
  float v = 0.0f;
  size_t m = 0, taken = 0;
  for (; m < quota && taken < r; ++m) {
    const float a = std::fabs(out->val[from + m]);
    if (a >= next) continue;
    if (taken == 0) v = a;
    ++taken;
  }
  const size_t n = end - begin;
  if (taken < r || p->CountAbove(acc + begin, n, v) != above + in_edge ||
      p->CountAbove(acc + begin, n, StrictAbove(v)) != above) {
    out->idx.resize(from);
    out->val.resize(from);
    return false;
  }
  // Positions [0, m) hold the r edge-bin entries and the higher ones before them; the higher
  // entries after idx[m - 1] come from one more scan.
  size_t higher = m - r;
  out->idx.resize(from + m);
  out->val.resize(from + m);
  const size_t rest = above - higher;
  if (rest > 0) {
    const size_t after = out->idx[from + m - 1] + 1;
    out->idx.resize(from + m + rest);
    out->val.resize(from + m + rest);
    (void)p->SelectAbove(acc, after, end, next, false, out->idx.data() + from + m,
                         out->val.data() + from + m, rest);
  }
  return true;
}

// The top `quota` of the candidates out's entries from `from` on (every entry of the range in the
// histogram bins from `bin` up, in index order): exactly what TrimTopK keeps (the largest
// magnitudes, ties toward the lower index, in index order), without its second histogram of the
// candidates: every candidate above the edge bin stays, and only the edge bin's own candidates
// are ranked (Primitives::TopKFromBoundaryBin, which the CPU top-k ends with too). False, with out
// unchanged, when the candidates are not what the histogram said (fewer than `quota` in the edge
// bin and above it, or `quota` or more above it): the caller then trims them the general way.
bool TrimAtEdgeBin(Selection* out, size_t from, size_t quota, uint32_t bin) {
  const size_t m = out->idx.size() - from;
  uint32_t* idx = out->idx.data() + from;
  float* val = out->val.data() + from;
  size_t above = 0;
  std::vector<uint32_t> keys;
  for (size_t j = 0; j < m; ++j) {
    const uint32_t u = Primitives::MagnitudeBits(val[j]);
    if ((u >> 15) > bin) {
      ++above;
    } else if ((u >> 15) == bin) {
      keys.push_back(u);
    } else {
      return false;  // below the edge: not the candidates of this edge
    }
  }
  if (above >= quota || above + keys.size() < quota) return false;
  const size_t w = Primitives::TopKFromBoundaryBin(idx, val, m, quota, above, &keys, idx, val);
  out->idx.resize(from + w);
  out->val.resize(from + w);
  return true;
}

// The smallest |val| of out's entries from `from` on (+Inf for none): the threshold a trimmed
// selection applied.
float MinMagnitude(const Selection& out, size_t from) {
  float t = std::numeric_limits<float>::infinity();
  for (size_t j = from; j < out.val.size(); ++j) t = std::min(t, std::fabs(out.val[j]));
  return t;
}

// Bins above 0xFF00 (+Inf's bin) hold NaNs, which are never selected; bin 0 holds zeros (and
// the tiniest denormals), which are never worth sending.
constexpr uint32_t kTop = 0xFF00;
// How far below the hint counting starts: 32 of the 128 bins per power of two (7 mantissa bits
// per bin), a factor 2^(1/4) ~ 1.19 in magnitude. Between steps the edge moves by a bin or two
// on bench/histogram_select_bench's synthetic gradients (far more between a MiCRO partition's
// selections on the CNN: micro.cc's kSumCountMargin); a wider margin counts more entries one by
// one.
constexpr uint32_t kMargin = 32;

}  // namespace

uint32_t HistogramCountStart(const uint32_t* edge_hint, uint32_t margin) {
  return edge_hint != nullptr && *edge_hint > margin ? std::min(*edge_hint, kTop) - margin : 0;
}

float HistogramQuotaSelect(Primitives* p, const float* acc, size_t begin, size_t end, size_t quota,
                           bool trim, std::vector<uint32_t>* bins, Selection* out, Scratch* scratch,
                           uint32_t* edge_hint, uint32_t counted_from) {
  constexpr float kNone = std::numeric_limits<float>::infinity();
  if (quota == 0 || end <= begin) return kNone;
  // Counts the bins from `first` on (all of them for 0) and finds the edge: the highest bin b
  // where the bins from b up hold at least `quota` entries. False when the counted bins hold
  // fewer (then only a full count can say where the edge is). Host primitives count into `bins`
  // and walk them here; device primitives walk them on the device (AbsHistogramEdge), so only
  // the edge comes back, not the bins.
  const bool device = p->device() != Device::kCpu;
  Scratch local(p);  // device primitives without a caller's Scratch (failures then stay local)
  if (device && scratch == nullptr) scratch = &local;
  HistogramEdge e;
  // Counted already from counted_from on (the local sum's pass): that is the first count.
  bool precounted = !device && counted_from <= kTop && bins->size() == Primitives::kHistogramBins;
  auto count_from = [&](uint32_t first) {
    if (device) {
      absl::StatusOr<HistogramEdge> r = p->AbsHistogramEdge(acc, begin, end, first, quota);
      if (!r.ok()) {
        scratch->Fail(r.status());
        e = HistogramEdge();
        e.bin = std::max<uint32_t>(first, 1);
        return true;  // nothing counted: cum 0 selects nothing; the failure is in scratch
      }
      e = *r;
    } else {
      if (!precounted) {  // a failure goes into scratch
        bins->assign(Primitives::kHistogramBins, 0);
        (void)HistogramToHost(p, acc, begin, end, first, bins->data(), scratch);
      }
      precounted = false;  // a second count (from lower) counts afresh
      e = Primitives::WalkHistogramEdge(bins->data(), first, quota);
    }
    return e.reached != 0;
  };
  const uint32_t first = precounted ? counted_from : HistogramCountStart(edge_hint, kMargin);
  // A hint above the edge (the bins counted hold fewer than the quota) gets one more count from
  // kRetry bins lower before the full one: the full count takes an increment for every entry
  // of the range, and on micro@0.1's CNN bucket (partitions alternating between steps) about
  // half of the hints fell short, mostly by 100-200 bins.
  constexpr uint32_t kRetry = 256;
  if (first == 0) {
    count_from(0);
  } else if (!count_from(first) && (first <= kRetry || !count_from(first - kRetry))) {
    count_from(0);
  }
  // Not reached from bin 0: every non-zero entry is fewer than the quota; take them all.
  uint32_t b = e.reached ? e.bin : 0;
  const uint64_t cum = e.cum;
  if (edge_hint != nullptr) *edge_hint = std::max<uint32_t>(b, 1);
  if (b == 0) b = 1;  // fewer non-zero entries than the quota: take them all
  if (cum == 0) return kNone;
  const uint32_t bits = b << 15;
  float edge;
  std::memcpy(&edge, &bits, sizeof(edge));
  const size_t from = out->idx.size();
  if (device) {
    // Selected, cut to the quota and compacted on the device; one copy of the pairs comes out.
    const size_t c =
        AppendAboveTopDevice(p, acc, begin, end, edge, cum, trim ? quota : cum, out, scratch);
    return !trim || c <= quota ? edge : MinMagnitude(*out, from);
  }
  const size_t in_edge = e.in_edge;
  if (trim && cum > quota && in_edge > quota && b < kTop) {
    const uint32_t next_bits = (b + 1) << 15;
    float next;
    std::memcpy(&next, &next_bits, sizeof(next));
    // Casting away const is safe: nothing is zeroed (zero=false).
    if (SingleMagnitudeEdge(p, const_cast<float*>(acc), begin, end, edge, next, cum - in_edge,
                            in_edge, quota, out)) {
      return MinMagnitude(*out, from);
    }
  }
  // The select's count is known: cum entries are >= edge (casting away const is safe: zero=false).
  AppendAbove(p, const_cast<float*>(acc), nullptr, begin, end, edge, false, cum, out, scratch);
  if (!trim || out->idx.size() - from <= quota) return edge;
  if (!TrimAtEdgeBin(out, from, quota, b)) TrimTopK(p, out, from, quota, scratch);
  return MinMagnitude(*out, from);
}

void SaveThresholdState(StateWriter* w, float th, uint64_t k_prev, uint32_t edge_hint) {
  w->Put(th);
  w->Put(k_prev);
  w->Put(edge_hint);
}

bool LoadThresholdState(StateReader& r, float* th, uint64_t* k_prev, uint32_t* edge_hint) {
  float t;
  uint64_t k;
  uint32_t e;
  if (!r.Get(&t) || !r.Get(&k) || !r.Get(&e)) return false;
  *th = t;
  *k_prev = k;
  *edge_hint = e;
  return true;
}

}  // namespace spex
