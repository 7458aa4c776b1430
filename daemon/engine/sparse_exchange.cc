// The sparse exchange patterns A and B over any Collective (sparse_exchange.h).
#include "daemon/engine/sparse_exchange.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "daemon/engine/half_exchange.h"
#include "daemon/engine/wire.h"
#include "kernels/base/no_init.h"
#include "kernels/half.h"

namespace spex {

namespace {

// Runs that are each strictly ascending and, taken in the order of their first index, do not
// overlap (MiCRO's and ExDyna's selections: each node's lies in a range it owns): their union is
// them in that order, one copy with nothing to merge or deduplicate. False otherwise, with out
// unchanged; *strict says whether every run was strictly ascending (so sorted: the caller need
// not look again).
bool ConcatDisjointRuns(const std::vector<absl::Span<const uint32_t>>& runs,
                        std::vector<uint32_t>* out, bool* strict) {
  *strict = false;
  std::vector<size_t> order;  // the non-empty runs
  size_t total = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    const absl::Span<const uint32_t> x = runs[r];
    if (x.empty()) continue;
    if (std::adjacent_find(x.begin(), x.end(), std::greater_equal<uint32_t>()) != x.end()) {
      return false;
    }
    order.push_back(r);
    total += x.size();
  }
  *strict = true;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return runs[a].front() < runs[b].front(); });
  for (size_t i = 1; i < order.size(); ++i) {
    if (runs[order[i]].front() <= runs[order[i - 1]].back()) return false;
  }
  out->clear();
  out->reserve(total);
  for (size_t r : order) out->insert(out->end(), runs[r].begin(), runs[r].end());
  return true;
}

}  // namespace

void SortedUnion(const std::vector<absl::Span<const uint32_t>>& runs, std::vector<uint32_t>* out,
                 std::vector<uint32_t>* scratch) {
  bool strict = false;
  if (ConcatDisjointRuns(runs, out, &strict)) return;
  bool sorted = true;
  for (size_t r = 0; r < runs.size() && sorted && !strict; ++r)
    sorted = std::is_sorted(runs[r].begin(), runs[r].end());
  std::vector<size_t> bounds(1, 0), next;  // the runs' ends in *out
  out->clear();
  for (const absl::Span<const uint32_t> x : runs) {
    out->insert(out->end(), x.begin(), x.end());
    bounds.push_back(out->size());
  }
  if (!sorted) {
    std::sort(out->begin(), out->end());
  } else if (runs.size() > 1) {
    std::vector<uint32_t>* src = out;
    std::vector<uint32_t>* dst = scratch;
    while (bounds.size() > 2) {
      dst->resize(src->size());
      next.assign(1, 0);
      for (size_t r = 0; r + 1 < bounds.size(); r += 2) {
        const size_t a = bounds[r], b = bounds[r + 1],
                     c = r + 2 < bounds.size() ? bounds[r + 2] : b;
        std::merge(src->begin() + a, src->begin() + b, src->begin() + b, src->begin() + c,
                   dst->begin() + a);
        next.push_back(c);
      }
      bounds.swap(next);
      std::swap(src, dst);
    }
    if (src != out) out->swap(*src);
  }
  out->erase(std::unique(out->begin(), out->end()), out->end());
}

void SortedUnion(const std::vector<uint32_t>& v, const std::vector<size_t>& off,
                 std::vector<uint32_t>* out, std::vector<uint32_t>* scratch) {
  std::vector<absl::Span<const uint32_t>> runs;
  for (size_t r = 0; r + 1 < off.size(); ++r)
    runs.emplace_back(v.data() + off[r], off[r + 1] - off[r]);
  SortedUnion(runs, out, scratch);
}

namespace {

// The union's values and their half sums: scratch of the calling thread (the engine's or the
// wire stage's), filled in full before they are read. Fresh vectors cleared about 2.6 MB that
// nothing read at every step of micro@0.1's CNN bucket.
struct UnionScratch {
  NoInitVector<float> vals, sum;
};

UnionScratch& ThreadUnionScratch() {
  thread_local UnionScratch scratch;
  return scratch;
}

// ExchangeIndexUnion's value stage: the union's values summed over the nodes and scaled to the
// average, in place. Half values on the wire where the wire type is half (float32 sums, scaled
// and rounded once: half_exchange.h); when a sum does not fit the type, every node holds the
// same non-finite result and decides alike: the values go again as float32, each scaled first
// (as DDP divides before it sums), and values_sent stays float32 so the residual is zeroed at
// the union (nothing was rounded) instead of keeping -Inf. acc is finite (the local reduce
// checks it), so only such an overflow makes the half result non-finite.
// `kept` (set when the gather kept the rounding in acc at union u, which only a half wire on more
// than one node does): where the half exchange fails or does not fit, acc is written back from
// vals (still acc's values) before anything else.
absl::Status AverageUnionValues(Collective* coll, Primitives* prims, const SparseExchangeArgs& args,
                                NoInitVector<float>* vals, SparseExchangeResult* res,
                                float* kept = nullptr, const std::vector<uint32_t>* u = nullptr) {
  const int n = coll->size();
  if (vals->empty()) return absl::OkStatus();
  auto undo = [&] {
    if (kept == nullptr) return;
    for (size_t j = 0; j < u->size(); ++j) kept[(*u)[j]] = (*vals)[j];
    kept = nullptr;
  };
  bool scaled = false;
  if (IsHalf(args.wire) && n > 1) {
    HalfAllReduceBytes hb;
    NoInitVector<float>& sum = ThreadUnionScratch().sum;
    sum.resize(vals->size());  // HalfAllReduceScaled writes all of it
    if (absl::Status s = HalfAllReduceScaled(coll, args.wire, vals->data(), sum.data(),
                                             vals->size(), args.scale, &hb);
        !s.ok()) {
      undo();
      return s;
    }
    res->bytes_sent += hb.sent;
    res->bytes_received += hb.received;
    if (std::all_of(sum.begin(), sum.end(), [](float v) { return std::isfinite(v); })) {
      vals->swap(sum);
      res->values_sent = args.wire;
      res->residual_kept = kept != nullptr;
      return absl::OkStatus();
    }
    undo();
    prims->Scale(vals->data(), args.scale, vals->size());
    scaled = true;
  }
  if (n > 1) {
    if (absl::Status s =
            coll->AllReduce(vals->data(), vals->size(), ElemType::kFloat32, ReduceOp::kSum);
        !s.ok()) {
      return s;
    }
    res->bytes_sent += vals->size() * 4;
    res->bytes_received += vals->size() * 4;
  }
  if (!scaled) prims->Scale(vals->data(), args.scale, vals->size());
  return absl::OkStatus();
}

}  // namespace

void ReplaceAt(float* out, size_t n, const std::vector<uint32_t>& prev, const uint32_t* u,
               const float* val, size_t m) {
  constexpr size_t kBlock = size_t{1} << 15;  // 128 KiB of out: well inside a core's L2
  size_t i = 0, j = 0;
  for (size_t end = kBlock; i < prev.size() || j < m; end += kBlock) {
    const size_t stop = std::min(end, n);
    for (; i < prev.size() && prev[i] < stop; ++i) out[prev[i]] = 0.0f;
    for (; j < m && u[j] < stop; ++j) out[u[j]] = val[j];
    if (stop == n) break;
  }
}

absl::Status ExchangeIndexUnion(Collective* coll, Primitives* prims, const SparseExchangeArgs& args,
                                absl::Span<const uint32_t> my_idx, float* acc, float* out,
                                SparseExchangeResult* res, const DeviceSide* device) {
  const int n = coll->size();
  // Indices travel in an index-only wire chunk, validated by the receiver.
  std::vector<uint8_t> mine;
  EncodeIndexChunk(args.group_id, args.step, args.elements, my_idx, args.scalars, &mine,
                   args.index_encoding);
  std::vector<size_t> bytes;
  std::vector<uint8_t> all;
  if (absl::Status s = coll->AllGatherV(mine.data(), mine.size(), &bytes, &all); !s.ok()) return s;
  res->bytes_sent = mine.size();
  res->bytes_received = all.size() - mine.size();
  res->counts.assign(n, 0);
  std::vector<DecodedChunk> chunks;
  chunks.reserve(n);
  std::vector<absl::Span<const uint32_t>> runs;
  size_t off = 0;
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<DecodedChunk> d =
        DecodeIndexChunk(all.data() + off, bytes[r], args.group_id, args.step, args.elements, r);
    if (!d.ok()) return d.status();
    chunks.push_back(*std::move(d));  // a move keeps idx_copy's storage, which idx may point to
    const DecodedChunk& c = chunks.back();
    res->counts[r] = c.header.count;
    runs.emplace_back(c.idx, c.header.count);
    off += bytes[r];
  }
  std::vector<uint32_t>& u = res->gathered_idx;
  SortedUnion(runs, &u, &res->touched);  // nodes' sets may overlap (topk_union, thresh): dedup
  // Every node derived the same union from the same bytes, so every node issues the values'
  // all-reduce below; a local failure before it (a device copy) still takes part, with zeros,
  // and is returned afterwards (lockstep: no node may skip a collective its peers enter).
  NoInitVector<float>& vals = ThreadUnionScratch().vals;
  vals.resize(u.size());            // every path below writes all of it (a failure: zeros)
  const uint32_t* dev_u = nullptr;  // the union in device scratch (slot 0)
  float* dev_vals = nullptr;        // slot 1
  float* kept = nullptr;            // acc, when the gather kept the wire's rounding there
  // Decoded chunks hold only indices inside the bucket; checked once more before the fused
  // passes, which index acc and out without the primitives' checks.
  const bool u_inside = u.empty() || u.back() < args.elements;
  absl::Status local;
  if (device != nullptr && !u.empty()) {
    absl::StatusOr<void*> du = device->scratch->Upload(0, u.data(), u.size() * 4);
    absl::StatusOr<void*> dv = du.ok() ? device->scratch->Get(1, u.size() * 4) : du;
    local = dv.status();
    if (local.ok()) {
      dev_u = static_cast<const uint32_t*>(*du);
      dev_vals = static_cast<float*>(*dv);
      local = device->prims->Gather(acc, args.elements, dev_u, u.size(), dev_vals);
      if (local.ok()) local = device->prims->CopyToHost(vals.data(), dev_vals, u.size() * 4);
    }
  } else if (device == nullptr && args.keep_rounding && IsHalf(args.wire) && n > 1 && u_inside) {
    half::GatherKeepRounding(args.wire, acc, u.data(), u.size(), vals.data());
    kept = acc;
  } else if (device == nullptr) {
    local = prims->Gather(acc, args.elements, u.data(), u.size(), vals.data());
  }
  if (!local.ok()) std::fill(vals.begin(), vals.end(), 0.0f);
  if (absl::Status s = AverageUnionValues(coll, prims, args, &vals, res, kept, &u); !s.ok()) {
    return s;
  }
  if (!local.ok()) return local;
  // out is zero at every position of u (the caller's contract), so adding writes the average.
  if (device != nullptr) {
    if (!u.empty()) {
      absl::Status s = device->prims->CopyFromHost(dev_vals, vals.data(), u.size() * 4);
      if (s.ok()) s = device->prims->ScatterAdd(out, args.elements, dev_u, dev_vals, u.size());
      if (!s.ok()) return s;
    }
  } else if (args.out_nonzero != nullptr) {
    const std::vector<uint32_t>& prev = *args.out_nonzero;
    if (!u_inside || (!prev.empty() && prev.back() >= args.elements)) {
      return absl::InternalError(absl::StrCat("pattern A's output positions pass the bucket's ",
                                              args.elements, " elements"));
    }
    ReplaceAt(out, args.elements, prev, u.data(), vals.data(), u.size());
    res->out_replaced = true;
  } else {
    absl::Status s = prims->ScatterAdd(out, args.elements, u.data(), vals.data(), u.size());
    if (!s.ok()) return s;
  }
  res->touched = u;
  return absl::OkStatus();
}

absl::Status ExchangeSparseGather(Collective* coll, Primitives* prims,
                                  const SparseExchangeArgs& args, absl::Span<const uint32_t> my_idx,
                                  absl::Span<const float> my_val, float* out,
                                  SparseExchangeResult* res, const DeviceSide* device) {
  const int n = coll->size();
  std::vector<uint8_t> mine;
  // A half bucket's own type, else float32 or float16 (--fp16_values); float32 where a value
  // would not fit (ValuesWire: never narrowed into an infinity).
  const DType asked = IsHalf(args.wire) ? args.wire : args.fp16 ? DType::kFloat16 : DType::kFloat32;
  res->values_sent = ValuesWire(asked, my_val);
  EncodeChunk(args.group_id, args.step, args.elements, my_idx, my_val, res->values_sent,
              args.scalars, &mine, args.index_encoding);
  std::vector<size_t> bytes;
  std::vector<uint8_t> all;
  if (absl::Status s = coll->AllGatherV(mine.data(), mine.size(), &bytes, &all); !s.ok()) return s;
  res->bytes_sent = mine.size();
  res->bytes_received = all.size() - mine.size();
  // Validate every chunk before writing anything.
  std::vector<DecodedChunk> chunks;
  chunks.reserve(n);
  size_t off = 0;
  for (int r = 0; r < n; ++r) {
    auto d = DecodeChunk(all.data() + off, bytes[r], args.group_id, args.step, args.elements, r);
    if (!d.ok()) return d.status();
    chunks.push_back(std::move(*d));
    off += bytes[r];
  }
  res->counts.assign(n, 0);
  res->gathered_idx.clear();
  std::vector<size_t> runs(1, 0);
  std::vector<float> values;  // device: every node's scaled values, in gathered_idx's order
  for (int r = 0; r < n; ++r) {
    DecodedChunk& c = chunks[r];
    res->counts[r] = c.header.count;
    res->gathered_idx.insert(res->gathered_idx.end(), c.idx, c.idx + c.header.count);
    runs.push_back(res->gathered_idx.size());
    // The decoded values are this call's own copy: scale them in place.
    prims->Scale(c.values.data(), args.scale, c.values.size());
    if (device != nullptr) {
      values.insert(values.end(), c.values.begin(), c.values.end());
      continue;
    }
    absl::Status s = prims->ScatterAdd(out, args.elements, c.idx, c.values.data(), c.values.size());
    if (!s.ok()) return s;
  }
  if (device != nullptr) {
    // One scatter-add per node in node order, as on the host.
    absl::Status s =
        ScatterAddOnDevice(*device, out, args.elements, res->gathered_idx, values, runs);
    if (!s.ok()) return s;
  }
  std::vector<uint32_t> scratch;
  SortedUnion(res->gathered_idx, runs, &res->touched, &scratch);
  return absl::OkStatus();
}

absl::Status ScatterAddOnDevice(const DeviceSide& device, float* out, uint32_t elements,
                                const std::vector<uint32_t>& idx, const std::vector<float>& val,
                                const std::vector<size_t>& runs) {
  if (val.empty()) return absl::OkStatus();
  absl::StatusOr<void*> di = device.scratch->Upload(0, idx.data(), val.size() * 4);
  if (!di.ok()) return di.status();
  absl::StatusOr<void*> dv = device.scratch->Upload(1, val.data(), val.size() * 4);
  if (!dv.ok()) return dv.status();
  const auto* d_idx = static_cast<const uint32_t*>(*di);
  const auto* d_val = static_cast<const float*>(*dv);
  for (size_t r = 0; r + 1 < runs.size(); ++r) {
    const size_t m = runs[r + 1] - runs[r];
    if (m == 0) continue;
    absl::Status s = device.prims->ScatterAdd(out, elements, d_idx + runs[r], d_val + runs[r], m);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace spex
