// The Ok-Topk sparse all-reduce for pattern-B selections (oktopk_exchange.h): regions,
// threshold, the reduce-scatter and the all-gather of the winners.
#include "daemon/engine/oktopk_exchange.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/engine/wire.h"

namespace spex {

std::vector<uint32_t> EqualRegions(uint32_t elements, int nodes) {
  std::vector<uint32_t> b(nodes + 1, 0);
  const uint32_t share = elements / nodes;
  const uint32_t extra = elements % nodes;
  for (int r = 0; r < nodes; ++r) {
    b[r + 1] = b[r] + share + (static_cast<uint32_t>(r) < extra ? 1 : 0);
  }
  return b;
}

namespace {

constexpr int kRadixBins = 256;  // 4 rounds of 8 bits find a float magnitude exactly

// The owner of `i` under `bounds` (bounds sorted, i < bounds.back()).
int OwnerOf(absl::Span<const uint32_t> bounds, uint32_t i) {
  auto it = std::upper_bound(bounds.begin(), bounds.end(), i);
  return static_cast<int>(it - bounds.begin()) - 1;
}

absl::Status CheckBounds(absl::Span<const uint32_t> bounds, int n, uint32_t elements) {
  if (static_cast<int>(bounds.size()) != n + 1 || bounds.front() != 0 ||
      bounds.back() != elements || !std::is_sorted(bounds.begin(), bounds.end())) {
    return absl::InvalidArgumentError(absl::StrCat("oktopk: region bounds must be ", n + 1,
                                                   " sorted positions from 0 to ", elements));
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const OkTopkOptions& o) {
  if (o.global != OkTopkGlobal::kTopk) return absl::OkStatus();
  if (o.k == 0) {
    return absl::InvalidArgumentError(
        "oktopk: global selection topk needs k > 0 (the entries kept per exchange)");
  }
  if (o.recompute_every == 0) {
    return absl::InvalidArgumentError(
        "oktopk: recompute_every must be >= 1 (1 = an exact selection every exchange)");
  }
  if (!(o.global_factor > 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("oktopk: global_factor must be > 1, not ", o.global_factor));
  }
  return absl::OkStatus();
}

// |v| as an unsigned key: for non-negative floats the bit patterns order as the values do
// (NaN above +inf), so the magnitude order is the key order.
uint32_t MagnitudeKey(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b & 0x7fffffffu;
}

float KeyToFloat(uint32_t key) {
  float f;
  std::memcpy(&f, &key, sizeof(f));
  return f;
}

// Phase 0: the regions re-agreed from every node's selection. Each node offers the P-1
// quantiles of its sorted selection (the equal split if it selected fewer than P); all nodes
// gather every offer, validate it (naming the node) and take the mean per boundary. Means of
// non-decreasing sequences are non-decreasing, so the regions are valid; empty ones are allowed.
absl::Status Rebalance(Collective* coll, uint32_t elements, absl::Span<const uint32_t> my_idx,
                       std::vector<uint32_t>* bounds, uint64_t* control_bytes) {
  const int n = coll->size();
  std::vector<uint32_t> sorted(my_idx.begin(), my_idx.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint32_t> offer(n - 1);
  for (int j = 1; j < n; ++j) {
    // S[floor(j |S| / P)], not S[j floor(|S| / P)]: the latter leaves up to P - 1 extra
    // entries per node in the last region (11 instead of 3 at |S| = 200, P = 64).
    offer[j - 1] = sorted.size() >= static_cast<size_t>(n)
                       ? sorted[static_cast<size_t>(j) * sorted.size() / n]
                       : static_cast<uint32_t>(uint64_t{elements} * j / n);
  }
  std::vector<uint32_t> all(static_cast<size_t>(n) * (n - 1));
  const size_t bytes = offer.size() * sizeof(uint32_t);
  if (absl::Status s = coll->AllGather(offer.data(), bytes, all.data()); !s.ok()) return s;
  *control_bytes += bytes * (n - 1);
  std::vector<uint64_t> sum(n - 1, 0);
  for (int r = 0; r < n; ++r) {
    const uint32_t* q = all.data() + static_cast<size_t>(r) * (n - 1);
    for (int j = 0; j < n - 1; ++j) {
      if (q[j] > elements || (j > 0 && q[j] < q[j - 1])) {
        return absl::DataLossError(absl::StrCat(
            "oktopk: node ", r, " offered region boundaries that are not sorted positions <= ",
            elements, "; nothing written"));
      }
      sum[j] += q[j];
    }
  }
  bounds->assign(n + 1, 0);
  for (int j = 1; j < n; ++j) (*bounds)[j] = static_cast<uint32_t>(sum[j - 1] / n);
  (*bounds)[n] = elements;
  return absl::OkStatus();
}

// The exact global top-`k` of the owners' reduced entries by magnitude, ties to the smaller
// index: a radix search of the k-th largest key over all owners (4 sum all-reduces of 256-bin
// histograms), then an all-gather of every owner's count at that key, so the ties are taken in
// owner (= index) order. Fills `keep` (1 per entry of `keys`), `tie_share` (per owner: entries at
// the key it keeps), *kth (the key) and *total (entries kept over all owners). No entry moves.
absl::Status ExactTopK(Collective* coll, uint64_t k, const std::vector<uint32_t>& keys,
                       std::vector<uint8_t>* keep, std::vector<uint64_t>* tie_share, uint32_t* kth,
                       uint64_t* total, uint64_t* control_bytes) {
  const int n = coll->size();
  const int me = coll->rank();
  keep->assign(keys.size(), 0);
  tie_share->assign(n, 0);
  *total = 0;
  uint32_t prefix = 0;
  uint64_t need = 0, in_bin = 0;
  for (int round = 0; round < 4; ++round) {
    const int shift = 24 - 8 * round;
    std::vector<uint64_t> h(kRadixBins, 0);
    for (uint32_t key : keys) {
      if (round == 0 || (key >> (shift + 8)) == prefix) ++h[(key >> shift) & 0xff];
    }
    if (absl::Status s = coll->AllReduce(h.data(), h.size(), ElemType::kUint64, ReduceOp::kSum);
        !s.ok()) {
      return s;
    }
    *control_bytes += h.size() * sizeof(uint64_t);
    uint64_t sum = 0;
    for (uint64_t c : h) sum += c;
    if (round == 0) {
      if (sum == 0) return absl::OkStatus();  // nothing reduced anywhere: nothing kept
      need = std::min<uint64_t>(k, sum);
      *total = need;
    } else if (sum != in_bin) {
      return absl::DataLossError(absl::StrCat(
          "oktopk: the owners' magnitude histograms disagree (round ", round, " counts ", sum,
          " entries, the previous round ", in_bin, "): a node sent wrong counts; nothing written"));
    }
    uint64_t above = 0;
    int b = kRadixBins - 1;
    for (; b >= 0 && above + h[b] < need; --b) above += h[b];
    if (b < 0) {  // only reachable when the sums above were inconsistent
      return absl::DataLossError("oktopk: the owners' magnitude histograms are inconsistent");
    }
    need -= above;
    in_bin = h[b];
    prefix = (prefix << 8) | static_cast<uint32_t>(b);
  }
  *kth = prefix;
  // `need` entries at the k-th key are kept, in owner order then index order.
  uint64_t mine = 0;
  for (uint32_t key : keys) mine += key == prefix ? 1 : 0;
  std::vector<uint64_t> ties(n, 0);
  if (absl::Status s = coll->AllGather(&mine, sizeof(mine), ties.data()); !s.ok()) return s;
  *control_bytes += sizeof(mine) * (n - 1);
  uint64_t sum = 0;
  for (int r = 0; r < n; ++r) {
    (*tie_share)[r] = std::min(ties[r], need - std::min(need, sum));
    sum += ties[r];
  }
  if (sum != in_bin) {
    return absl::DataLossError(absl::StrCat("oktopk: the owners count ", sum,
                                            " entries at the k-th magnitude, their histograms ",
                                            in_bin, ": a node sent wrong counts; nothing written"));
  }
  uint64_t take = (*tie_share)[me];
  for (size_t j = 0; j < keys.size(); ++j) {
    if (keys[j] > prefix) {
      (*keep)[j] = 1;
    } else if (keys[j] == prefix && take > 0) {
      (*keep)[j] = 1;
      --take;
    }
  }
  return absl::OkStatus();
}

// ExchangeOkTopk's checks of the regions and the selection, before any collective.
absl::Status CheckInputs(absl::Span<const uint32_t> bounds, int n, const SparseExchangeArgs& args,
                         absl::Span<const uint32_t> my_idx, absl::Span<const float> my_val) {
  if (absl::Status s = CheckBounds(bounds, n, args.elements); !s.ok()) return s;
  if (my_idx.size() != my_val.size()) {
    return absl::InvalidArgumentError("oktopk: the selection's indices and values differ in size");
  }
  for (uint32_t i : my_idx) {
    if (i >= args.elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("oktopk: local index ", i, " >= bucket elements ", args.elements));
    }
  }
  return absl::OkStatus();
}

// Phase 1: the selection split by owner (keeping its order within each part), encoded as
// ExchangeSparseGather sends it and sent to the owners in one all-to-all. `recv` gets every
// node's part for my region.
absl::Status SendToOwners(Collective* coll, const SparseExchangeArgs& args,
                          absl::Span<const uint32_t> bounds, absl::Span<const uint32_t> my_idx,
                          absl::Span<const float> my_val, std::vector<std::vector<uint8_t>>* recv,
                          OkTopkResult* r) {
  const int n = coll->size();
  const int me = coll->rank();
  std::vector<std::vector<uint32_t>> part_idx(n);
  std::vector<std::vector<float>> part_val(n);
  for (size_t j = 0; j < my_idx.size(); ++j) {
    const int o = OwnerOf(bounds, my_idx[j]);
    part_idx[o].push_back(my_idx[j]);
    part_val[o].push_back(my_val[j]);
  }
  std::vector<std::vector<uint8_t>> send(n);
  // The selections' values as ExchangeSparseGather sends them: a half bucket's own type
  // (args.wire), else float32 or float16 (--fp16_values); every part as float32 where some
  // value of the selection would not fit (wire.h ValuesWire), so the residual's update is one
  // rule for the whole selection.
  const DType wire = ValuesWire(IsHalf(args.wire) ? args.wire
                                : args.fp16       ? DType::kFloat16
                                                  : DType::kFloat32,
                                my_val);
  r->values_sent = wire;
  for (int q = 0; q < n; ++q) {
    EncodeChunk(args.group_id, args.step, args.elements, part_idx[q], part_val[q], wire,
                args.scalars, &send[q], args.index_encoding);
    if (q != me) r->bytes_sent += send[q].size();
  }
  if (absl::Status s = coll->AllToAllV(send, recv); !s.ok()) return s;
  for (int q = 0; q < n; ++q) {
    if (q != me) r->bytes_received += (*recv)[q].size();
  }
  return absl::OkStatus();
}

// Every part received validated (the wire checks, then: inside my region) before anything is
// reduced, and agreed: every node learns whether any refused its input, so all stop before the
// next collective, and every node's selection size (r->counts).
absl::Status CheckParts(Collective* coll, const SparseExchangeArgs& args,
                        absl::Span<const uint32_t> bounds, size_t my_selected,
                        const std::vector<std::vector<uint8_t>>& recv,
                        std::vector<DecodedChunk>* parts, OkTopkResult* r) {
  const int n = coll->size();
  const int me = coll->rank();
  const uint32_t lo = bounds[me], hi = bounds[me + 1];
  absl::Status bad;
  for (int q = 0; q < n && bad.ok(); ++q) {
    auto d =
        DecodeChunk(recv[q].data(), recv[q].size(), args.group_id, args.step, args.elements, q);
    if (!d.ok()) {
      bad = d.status();
      break;
    }
    for (uint32_t j = 0; j < d->header.count; ++j) {
      if (d->idx[j] < lo || d->idx[j] >= hi) {
        bad = absl::DataLossError(absl::StrCat("oktopk: node ", q, " sent index ", d->idx[j],
                                               " outside node ", me, "'s region [", lo, ", ", hi,
                                               ")"));
        break;
      }
    }
    parts->push_back(std::move(*d));
  }
  // Slot 0: some node refused its input; slot 1 + node: that node's selection size.
  std::vector<int64_t> flags(n + 1, 0);
  flags[0] = bad.ok() ? 0 : 1;
  flags[1 + me] = static_cast<int64_t>(my_selected);
  if (absl::Status s =
          coll->AllReduce(flags.data(), flags.size(), ElemType::kInt64, ReduceOp::kSum);
      !s.ok()) {
    return s;
  }
  r->control_bytes += flags.size() * sizeof(int64_t);
  if (!bad.ok()) return bad;
  if (flags[0] != 0) {
    return absl::DataLossError(absl::StrCat("oktopk: another node refused malformed data from ",
                                            "a peer (see that node's log); nothing written"));
  }
  r->counts.assign(n, 0);
  for (int q = 0; q < n; ++q) r->counts[q] = static_cast<uint64_t>(flags[1 + q]);
  return absl::OkStatus();
}

// Phase 2: my region reduced in node order, values scaled first (as ExchangeSparseGather), into
// sorted, unique indices and their sums. O(pairs received), not O(region): the pairs,
// concatenated in node order, are stably sorted by index, and each index's run is summed from 0
// in that order, which is what adding them into a zeroed dense buffer does, bit for bit. (A
// region-sized buffer per exchange cost 12.7M floats of fresh pages per node at 2 nodes and
// 25.6M elements: ~0.4 s of page faults on this machine.)
void ReduceRegion(Primitives* prims, float scale, int me, std::vector<DecodedChunk>* parts,
                  std::vector<uint32_t>* mine_idx, std::vector<float>* mine_val, OkTopkResult* r) {
  std::vector<std::pair<uint32_t, float>> pairs;
  {
    size_t total = 0;
    for (const DecodedChunk& part : *parts) total += part.header.count;
    pairs.reserve(total);
  }
  for (int q = 0; q < static_cast<int>(parts->size()); ++q) {
    DecodedChunk& part = (*parts)[q];
    r->rs_pairs += part.header.count;
    if (q != me) r->rs_received += part.header.count;
    prims->Scale(part.values.data(), scale, part.values.size());
    for (uint32_t j = 0; j < part.header.count; ++j)
      pairs.emplace_back(part.idx[j], part.values[j]);
  }
  std::stable_sort(pairs.begin(), pairs.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t j = 0; j < pairs.size();) {
    float sum = 0.0f;
    size_t e = j;
    for (; e < pairs.size() && pairs[e].first == pairs[j].first; ++e) sum += pairs[e].second;
    mine_idx->push_back(pairs[j].first);
    mine_val->push_back(sum);
    j = e;
  }
}

// Phase 3's outcome: the entries of my region kept globally, and what the owners' gathered
// entries are checked against in phase 4.
struct GlobalSelection {
  std::vector<uint32_t> idx;
  std::vector<float> val;
  float threshold = 0.0f;           // the threshold after this exchange's selection
  std::vector<uint64_t> tie_share;  // exact: per owner, entries kept at the k-th magnitude
  uint32_t kth = 0;                 // exact: the k-th magnitude's key
  uint64_t exact_total = 0;         // exact: entries kept over all owners
};

// Phase 3: the global selection among my reduced entries: all of them ("all"), the exact top-k
// (ExactTopK), or those above the threshold.
absl::Status SelectGlobal(Collective* coll, const OkTopkOptions& opts, bool topk, float threshold,
                          const std::vector<uint32_t>& mine_idx, const std::vector<float>& mine_val,
                          GlobalSelection* sel, OkTopkResult* r) {
  sel->threshold = threshold;
  std::vector<uint32_t> keys(mine_idx.size());
  for (size_t j = 0; j < mine_idx.size(); ++j) keys[j] = MagnitudeKey(mine_val[j]);
  std::vector<uint8_t> keep(mine_idx.size(), 1);  // "all"
  if (r->exact) {
    absl::Status s = ExactTopK(coll, opts.k, keys, &keep, &sel->tie_share, &sel->kth,
                               &sel->exact_total, &r->control_bytes);
    if (!s.ok()) return s;
    if (sel->exact_total > 0) sel->threshold = KeyToFloat(sel->kth);
  } else if (topk) {
    const uint32_t above = MagnitudeKey(threshold);
    for (size_t j = 0; j < keys.size(); ++j) keep[j] = keys[j] > above ? 1 : 0;
  }
  for (size_t j = 0; j < mine_idx.size(); ++j) {
    if (!keep[j]) continue;
    sel->idx.push_back(mine_idx[j]);
    sel->val.push_back(mine_val[j]);
  }
  return absl::OkStatus();
}

// Phase 4: the kept entries all-gathered (fp32: they are final values, not a selection) and
// every owner's checked: sorted, unique, inside its region, none below the global threshold
// (`previous`: the threshold the selection used), the exact selection's counts. Every node
// received the same bytes: all refuse alike, before anything is written. `owners` point into
// `all`, the gathered bytes.
absl::Status GatherKept(Collective* coll, const SparseExchangeArgs& args,
                        absl::Span<const uint32_t> bounds, bool topk, float previous,
                        const GlobalSelection& sel, std::vector<uint8_t>* all,
                        std::vector<DecodedChunk>* owners, uint64_t* kept_total, OkTopkResult* r) {
  const int n = coll->size();
  std::vector<uint8_t> reduced;
  EncodeChunk(args.group_id, args.step, args.elements, sel.idx, sel.val, /*fp16=*/false,
              args.scalars, &reduced, args.index_encoding);
  std::vector<size_t> bytes;
  if (absl::Status s = coll->AllGatherV(reduced.data(), reduced.size(), &bytes, all); !s.ok()) {
    return s;
  }
  r->bytes_sent += reduced.size();
  r->bytes_received += all->size() - reduced.size();
  *kept_total = 0;
  const uint32_t above = MagnitudeKey(previous);
  size_t off = 0;
  for (int q = 0; q < n; ++q) {
    auto d = DecodeChunk(all->data() + off, bytes[q], args.group_id, args.step, args.elements, q);
    if (!d.ok()) return d.status();
    uint64_t at_kth = 0;
    for (uint32_t j = 0; j < d->header.count; ++j) {
      if (d->idx[j] < bounds[q] || d->idx[j] >= bounds[q + 1] ||
          (j > 0 && d->idx[j] <= d->idx[j - 1])) {
        return absl::DataLossError(absl::StrCat("oktopk: node ", q,
                                                "'s reduced entries are not sorted, unique and "
                                                "inside its region; nothing written"));
      }
      const uint32_t key = MagnitudeKey(d->values[j]);
      if ((r->exact && key < sel.kth) || (topk && !r->exact && key <= above)) {
        return absl::DataLossError(absl::StrCat("oktopk: node ", q, " kept index ", d->idx[j],
                                                " below the global threshold; nothing written"));
      }
      at_kth += r->exact && key == sel.kth ? 1 : 0;
    }
    if (r->exact && at_kth != sel.tie_share[q]) {
      return absl::DataLossError(absl::StrCat("oktopk: node ", q, " kept ", at_kth,
                                              " entries at the k-th magnitude, not its share ",
                                              sel.tie_share[q], "; nothing written"));
    }
    *kept_total += d->header.count;
    owners->push_back(std::move(*d));
    off += bytes[q];
  }
  if (r->exact && *kept_total != sel.exact_total) {
    return absl::DataLossError(absl::StrCat("oktopk: the owners kept ", *kept_total,
                                            " entries in an exact selection of ", sel.exact_total,
                                            ": a node's counts are wrong; nothing written"));
  }
  return absl::OkStatus();
}

// The owners' kept entries added into `out` (per owner on the host, or one scatter-add on the
// device), and r's kept indices: gathered_idx, touched, owner_kept.
absl::Status WriteKept(Primitives* prims, const DeviceSide* device, uint32_t elements, int me,
                       const std::vector<DecodedChunk>& owners, uint64_t kept_total, float* out,
                       OkTopkResult* r) {
  const int n = static_cast<int>(owners.size());
  r->owner_kept.assign(n, 0);
  std::vector<float> values;  // device: every owner's kept values, in gathered_idx's order
  if (device != nullptr) values.reserve(kept_total);
  for (int q = 0; q < n; ++q) {
    const DecodedChunk& d = owners[q];
    r->owner_kept[q] = d.header.count;
    if (q != me) r->ag_received += d.header.count;
    r->gathered_idx.insert(r->gathered_idx.end(), d.idx, d.idx + d.header.count);
    if (device != nullptr) {
      values.insert(values.end(), d.values.begin(), d.values.begin() + d.header.count);
      continue;
    }
    absl::Status s = prims->ScatterAdd(out, elements, d.idx, d.values.data(), d.header.count);
    if (!s.ok()) return s;
  }
  if (device != nullptr) {
    // The owners' regions are disjoint: one scatter-add of them all writes what the host's
    // per-owner scatter-adds would, bit for bit.
    absl::Status s =
        ScatterAddOnDevice(*device, out, elements, r->gathered_idx, values, {0, values.size()});
    if (!s.ok()) return s;
  }
  // Owners' regions are disjoint and ascending and each run is sorted: already the union.
  r->touched = r->gathered_idx;
  return absl::OkStatus();
}

}  // namespace

absl::Status ExchangeOkTopk(Collective* coll, Primitives* prims, const SparseExchangeArgs& args,
                            const OkTopkOptions& opts, OkTopkState* state,
                            absl::Span<const uint32_t> my_idx, absl::Span<const float> my_val,
                            float* out, OkTopkResult* res, const DeviceSide* device) {
  const int n = coll->size();
  const int me = coll->rank();
  if (absl::Status s = CheckOptions(opts); !s.ok()) return s;
  std::vector<uint32_t> bounds =
      state->bounds.empty() ? EqualRegions(args.elements, n) : state->bounds;
  if (absl::Status s = CheckInputs(bounds, n, args, my_idx, my_val); !s.ok()) return s;
  const uint64_t c = state->exchanges;
  const bool topk = opts.global == OkTopkGlobal::kTopk;
  OkTopkResult r;
  r.exact = topk && c % opts.recompute_every == 0;
  // Phase 0: the regions, re-agreed from this exchange's selections every rebalance_every.
  if (opts.rebalance_every > 0 && c % opts.rebalance_every == 0 && n > 1) {
    absl::Status s = Rebalance(coll, args.elements, my_idx, &bounds, &r.control_bytes);
    if (!s.ok()) return s;
    r.rebalanced = true;
  }
  // Phase 1: every node's selection to the owners of its indices, checked and agreed.
  std::vector<std::vector<uint8_t>> recv;
  if (absl::Status s = SendToOwners(coll, args, bounds, my_idx, my_val, &recv, &r); !s.ok()) {
    return s;
  }
  std::vector<DecodedChunk> parts;
  if (absl::Status s = CheckParts(coll, args, bounds, my_idx.size(), recv, &parts, &r); !s.ok()) {
    return s;
  }
  // Phase 2: my region reduced.
  std::vector<uint32_t> mine_idx;
  std::vector<float> mine_val;
  ReduceRegion(prims, args.scale, me, &parts, &mine_idx, &mine_val, &r);
  // Phase 3: the global selection; phase 4: the kept entries gathered and written.
  GlobalSelection sel;
  if (absl::Status s =
          SelectGlobal(coll, opts, topk, state->threshold, mine_idx, mine_val, &sel, &r);
      !s.ok()) {
    return s;
  }
  std::vector<uint8_t> gathered;
  std::vector<DecodedChunk> owners;
  uint64_t kept_total = 0;
  if (absl::Status s = GatherKept(coll, args, bounds, topk, state->threshold, sel, &gathered,
                                  &owners, &kept_total, &r);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteKept(prims, device, args.elements, me, owners, kept_total, out, &r);
      !s.ok()) {
    return s;
  }
  // Error feedback: my selected indices that were kept (the caller zeroes its residual there).
  std::vector<uint32_t> selected(my_idx.begin(), my_idx.end());
  std::sort(selected.begin(), selected.end());
  selected.erase(std::unique(selected.begin(), selected.end()), selected.end());
  std::set_intersection(selected.begin(), selected.end(), r.touched.begin(), r.touched.end(),
                        std::back_inserter(r.my_kept));
  // Between exact selections the threshold follows the kept count into [2k/3, 4k/3].
  float threshold = sel.threshold;
  if (topk && !r.exact) {
    if (3 * kept_total < 2 * opts.k) threshold /= opts.global_factor;
    if (3 * kept_total > 4 * opts.k) threshold *= opts.global_factor;
  }
  state->exchanges = c + 1;
  state->threshold = threshold;
  if (r.rebalanced) state->bounds = bounds;
  *res = std::move(r);
  return absl::OkStatus();
}

absl::Status ExchangeOkTopk(Collective* coll, Primitives* prims, const SparseExchangeArgs& args,
                            absl::Span<const uint32_t> bounds, absl::Span<const uint32_t> my_idx,
                            absl::Span<const float> my_val, float* out, SparseExchangeResult* res) {
  OkTopkState state;
  state.bounds.assign(bounds.begin(), bounds.end());
  OkTopkResult r;
  absl::Status s =
      ExchangeOkTopk(coll, prims, args, OkTopkOptions{}, &state, my_idx, my_val, out, &r);
  if (s.ok()) *res = std::move(static_cast<SparseExchangeResult&>(r));
  return s;
}

}  // namespace spex
