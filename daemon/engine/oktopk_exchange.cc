#include "daemon/engine/oktopk_exchange.h"

#include <algorithm>

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

}  // namespace

absl::Status ExchangeOkTopk(Collective* coll, Primitives* prims, const SparseExchangeArgs& args,
                            absl::Span<const uint32_t> bounds_in, absl::Span<const uint32_t> my_idx,
                            absl::Span<const float> my_val, float* out, SparseExchangeResult* res) {
  const int n = coll->size();
  const int me = coll->rank();
  std::vector<uint32_t> equal;
  if (bounds_in.empty()) equal = EqualRegions(args.elements, n);
  absl::Span<const uint32_t> bounds = bounds_in.empty() ? absl::MakeConstSpan(equal) : bounds_in;
  if (absl::Status s = CheckBounds(bounds, n, args.elements); !s.ok()) return s;
  if (my_idx.size() != my_val.size()) {
    return absl::InvalidArgumentError("oktopk: the selection's indices and values differ in size");
  }
  // Phase 1: split the selection by owner, keeping its order within each part.
  std::vector<std::vector<uint32_t>> part_idx(n);
  std::vector<std::vector<float>> part_val(n);
  for (size_t j = 0; j < my_idx.size(); ++j) {
    if (my_idx[j] >= args.elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("oktopk: local index ", my_idx[j], " >= bucket elements ", args.elements));
    }
    const int o = OwnerOf(bounds, my_idx[j]);
    part_idx[o].push_back(my_idx[j]);
    part_val[o].push_back(my_val[j]);
  }
  std::vector<std::vector<uint8_t>> send(n), recv;
  res->bytes_sent = 0;
  for (int r = 0; r < n; ++r) {
    EncodeChunk(args.group_id, args.step, args.elements, part_idx[r], part_val[r], args.fp16,
                args.scalars, &send[r]);
    if (r != me) res->bytes_sent += send[r].size();
  }
  if (absl::Status s = coll->AllToAllV(send, &recv); !s.ok()) return s;
  res->bytes_received = 0;
  for (int r = 0; r < n; ++r) {
    if (r != me) res->bytes_received += recv[r].size();
  }
  // Validate every part (the wire checks, then: inside my region) before reducing anything.
  const uint32_t lo = bounds[me], hi = bounds[me + 1];
  std::vector<DecodedChunk> parts;
  absl::Status bad;
  for (int r = 0; r < n && bad.ok(); ++r) {
    auto d =
        DecodeChunk(recv[r].data(), recv[r].size(), args.group_id, args.step, args.elements, r);
    if (!d.ok()) {
      bad = d.status();
      break;
    }
    for (uint32_t j = 0; j < d->header.count; ++j) {
      if (d->idx[j] < lo || d->idx[j] >= hi) {
        bad = absl::DataLossError(absl::StrCat("oktopk: node ", r, " sent index ", d->idx[j],
                                               " outside node ", me, "'s region [", lo, ", ", hi,
                                               ")"));
        break;
      }
    }
    parts.push_back(std::move(*d));
  }
  // Every node learns whether any refused its input, so all stop before the next collective.
  int64_t flag = bad.ok() ? 0 : 1;
  if (absl::Status s = coll->AllReduce(&flag, 1, ElemType::kInt64, ReduceOp::kMax); !s.ok()) {
    return s;
  }
  if (!bad.ok()) return bad;
  if (flag != 0) {
    return absl::DataLossError(absl::StrCat("oktopk: another node refused malformed data from ",
                                            "a peer (see that node's log); nothing written"));
  }
  // Phase 2: reduce my region in node order, values scaled first (as ExchangeSparseGather).
  std::vector<float> acc(hi - lo, 0.0f);
  std::vector<uint8_t> seen(hi - lo, 0);
  std::vector<uint32_t> mine_idx;
  for (DecodedChunk& c : parts) {
    prims->Scale(c.values.data(), args.scale, c.values.size());
    for (uint32_t j = 0; j < c.header.count; ++j) {
      const uint32_t k = c.idx[j] - lo;
      acc[k] += c.values[j];
      if (!seen[k]) {
        seen[k] = 1;
        mine_idx.push_back(c.idx[j]);
      }
    }
  }
  std::sort(mine_idx.begin(), mine_idx.end());
  std::vector<float> mine_val(mine_idx.size());
  for (size_t j = 0; j < mine_idx.size(); ++j) mine_val[j] = acc[mine_idx[j] - lo];
  // Phase 3: all-gather the reduced entries (fp32: they are final values, not a selection).
  std::vector<uint8_t> reduced;
  EncodeChunk(args.group_id, args.step, args.elements, mine_idx, mine_val, /*fp16=*/false,
              args.scalars, &reduced);
  std::vector<size_t> bytes;
  std::vector<uint8_t> all;
  if (absl::Status s = coll->AllGatherV(reduced.data(), reduced.size(), &bytes, &all); !s.ok()) {
    return s;
  }
  res->bytes_sent += reduced.size();
  res->bytes_received += all.size() - reduced.size();
  std::vector<DecodedChunk> owners;
  size_t off = 0;
  for (int r = 0; r < n; ++r) {
    auto d = DecodeChunk(all.data() + off, bytes[r], args.group_id, args.step, args.elements, r);
    if (!d.ok()) return d.status();  // every node received the same bytes: all refuse alike
    for (uint32_t j = 0; j < d->header.count; ++j) {
      if (d->idx[j] < bounds[r] || d->idx[j] >= bounds[r + 1] ||
          (j > 0 && d->idx[j] <= d->idx[j - 1])) {
        return absl::DataLossError(absl::StrCat("oktopk: node ", r,
                                                "'s reduced entries are not sorted, unique and "
                                                "inside its region; nothing written"));
      }
    }
    owners.push_back(std::move(*d));
    off += bytes[r];
  }
  res->counts.assign(n, 0);
  res->gathered_idx.clear();
  for (int r = 0; r < n; ++r) {
    const DecodedChunk& c = owners[r];
    res->counts[r] = c.header.count;
    res->gathered_idx.insert(res->gathered_idx.end(), c.idx, c.idx + c.header.count);
    absl::Status s = prims->ScatterAdd(out, args.elements, c.idx, c.values.data(), c.header.count);
    if (!s.ok()) return s;
  }
  // Owners' regions are disjoint and ascending and each run is sorted: already the union.
  res->touched = res->gathered_idx;
  return absl::OkStatus();
}

}  // namespace spex
