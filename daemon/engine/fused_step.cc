// The fused exchange, selection ahead (see fused_step.h). Each member goes through the same
// operations as in DenseStep / SparseStep (dense_step.cc, sparse_step.cc and the patterns of
// sparse_exchange.cc), in the same order; only the collectives are shared.
#include "daemon/engine/fused_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/engine/half_exchange.h"
#include "daemon/engine/sparse_exchange.h"
#include "daemon/engine/wire.h"
#include "proto/contract/futex.h"

namespace spex {
namespace {

// One member's part in the fused exchange.
struct Member {
  StepItem* item = nullptr;
  MergeKind kind = MergeKind::kDense;
  absl::Status s;                // the first local failure; the collectives are issued regardless
  size_t offset = 0;             // D: in the staging buffer; A: in the values buffer
  float post_scale = 1.0f;       // D: the scale DenseStep applies after the all-reduce
  std::vector<DecodedChunk> in;  // A, B: every node's chunk, node order
  std::vector<uint32_t> union_idx;
  std::vector<uint64_t> counts;
  std::vector<uint32_t> gathered_idx;  // A: the union; B: every node's indices, concatenated
  std::vector<uint32_t> touched;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  // A, B: the type this node's values went out as (float16 under --fp16_values where they
  // fit: FinishSparse then keeps the rounding in the residual, as SparseStep does).
  DType values_sent = DType::kFloat32;
};

void Keep(absl::Status* s, absl::Status x) {
  if (s->ok() && !x.ok()) *s = std::move(x);
}

absl::Status OnDevice(const BucketData& b) {
  return absl::UnimplementedError(
      absl::StrCat("bucket ", b.id,
                   ": the fused exchange runs host-memory buckets only so far (this bucket is "
                   "device memory)"));
}

// Splits node `peer`'s message (`data`, `bytes`) into the members' chunks and decodes each
// against its bucket: one chunk per member, in group order, nothing after the last.
absl::Status SplitAndDecode(const uint8_t* data, size_t bytes, int peer, uint64_t step,
                            bool index_only, const std::vector<Member*>& members) {
  size_t off = 0;
  for (size_t j = 0; j < members.size(); ++j) {
    const BucketData& b = *members[j]->item->data;
    ChunkHeader h;
    if (bytes - off < sizeof(h)) {
      return absl::DataLossError(
          absl::StrCat("malformed fused message from node ", peer, " at step ", step, ": ", bytes,
                       " bytes end before the chunk of member ", j, " (bucket ", b.id, ")"));
    }
    std::memcpy(&h, data + off, sizeof(h));
    const size_t len = ChunkLength(data + off, bytes - off);  // the delta form's length word too
    if (len > bytes - off) {
      return absl::DataLossError(absl::StrCat("malformed fused message from node ", peer,
                                              " at step ", step, ": the chunk of member ", j,
                                              " (bucket ", b.id, ") says ", h.count, " entries, ",
                                              len, " bytes, but only ", bytes - off, " are left"));
    }
    const uint32_t n = static_cast<uint32_t>(b.elements);
    absl::StatusOr<DecodedChunk> d = index_only
                                         ? DecodeIndexChunk(data + off, len, b.id, step, n, peer)
                                         : DecodeChunk(data + off, len, b.id, step, n, peer);
    if (!d.ok()) return d.status();
    members[j]->in.push_back(std::move(*d));
    off += len;
  }
  if (off != bytes) {
    return absl::DataLossError(absl::StrCat("malformed fused message from node ", peer, " at step ",
                                            step, ": ", bytes - off,
                                            " bytes after the group's last chunk"));
  }
  return absl::OkStatus();
}

// One AllGatherV of every member's chunk (this node's are in scratch->send, chunk j ending at
// ends[j]), then every node's message split and decoded. On failure, every member of the
// sub-exchange gets it (every node saw the same bytes, so every node fails alike).
bool GatherChunks(const StepEnv& env, uint64_t step, bool index_only,
                  const std::vector<Member*>& members, const std::vector<size_t>& ends,
                  FusedScratch* scratch) {
  Collective* coll = env.coll;
  const int me = coll->rank();
  absl::Status s =
      coll->AllGatherV(scratch->send.data(), scratch->send.size(), &scratch->bytes, &scratch->recv);
  size_t off = 0;
  for (int r = 0; s.ok() && r < coll->size(); ++r) {
    s = SplitAndDecode(scratch->recv.data() + off, scratch->bytes[r], r, step, index_only, members);
    off += scratch->bytes[r];
  }
  if (!s.ok()) {
    for (Member* m : members) Keep(&m->s, s);
    return false;
  }
  for (size_t j = 0; j < members.size(); ++j) {
    Member& m = *members[j];
    m.bytes_sent = ends[j] - (j == 0 ? 0 : ends[j - 1]);
    m.counts.assign(coll->size(), 0);
    m.gathered_idx.clear();
    for (int r = 0; r < coll->size(); ++r) {
      const DecodedChunk& c = m.in[r];
      m.counts[r] = c.header.count;
      m.gathered_idx.insert(m.gathered_idx.end(), c.idx, c.idx + c.header.count);
      if (r != me) m.bytes_received += c.bytes;
    }
  }
  return true;
}

// The sorted, deduplicated indices of a member's gathered_idx (every node's chunk back to back,
// each ascending): SortedUnion's linear merges of the nodes' runs instead of a full sort.
void SortedUnique(const Member& m, std::vector<uint32_t>* out) {
  std::vector<size_t> off(1, 0);
  for (uint64_t c : m.counts) off.push_back(off.back() + c);
  if (off.back() != m.gathered_idx.size()) off.assign({0, m.gathered_idx.size()});  // one run
  std::vector<uint32_t> scratch;
  SortedUnion(m.gathered_idx, off, out, &scratch);
}

// Local stage of a D member (DenseStep's choice of what to send, into its staging slice).
void LocalDense(const StepEnv& env, Member& m, float scale, bool pow2, float* slice) {
  BucketData& b = *m.item->data;
  const size_t n = b.elements;
  m.post_scale = scale;
  if (b.on_device) {
    Keep(&m.s, OnDevice(b));
  } else {
    // The local sum, reduced before the step (its failure, if any, came in as the item's
    // status): acc for a sparse bucket (committed; going dense, residual included), else the
    // output (a half member's float32 staging), scaled already when N * L is a power of two.
    const bool sparse = m.item->sparse != nullptr;
    if (!sparse && pow2) m.post_scale = 1.0f;
    if (m.s.ok()) m.s = env.prims->Copy(slice, sparse ? b.acc : b.output, n);
  }
  if (!m.s.ok()) std::fill(slice, slice + n, 0.0f);
}

// Local stage of an A or B member (SparseStep's, up to the exchange).
void LocalSparse(const StepEnv& env, Member& m, const Lap& lap) {
  StepItem& item = *m.item;
  BucketData& b = *item.data;
  SparseState& st = *item.sparse;
  Compressor& c = *st.compressor;
  Selection& sel = st.sel;
  if (b.on_device) {
    Keep(&m.s, OnDevice(b));
    sel.idx.clear();
    sel.val.clear();
    lap(Phase::kReduceLocal);
    return;
  }
  lap(Phase::kReduceLocal);  // acc: residual + local sum, reduced before the step
  const Pattern pattern = c.pattern();
  if (m.s.ok() && item.density != c.density()) Keep(&m.s, c.SetDensity(item.density));
  if (m.s.ok()) {
    const uint64_t t0 = MonotonicNanos();
    Keep(&m.s,
         c.Select(item.step, b.acc, /*add=*/nullptr, pattern == Pattern::kSparseGather, &sel));
    item.select_ns = static_cast<int64_t>(MonotonicNanos() - t0);
  }
  if (!m.s.ok()) {  // contribute nothing; the step fails everywhere at the commit vote
    sel.idx.clear();
    sel.val.clear();
  }
  lap(Phase::kCompress);
  // The output holds last step's result: zero only the positions written then.
  if (st.output_dense) {
    Keep(&m.s, env.prims->Fill(b.output, 0.0f, b.elements));
    st.output_dense = false;
  } else if (!st.touched.empty()) {
    Keep(&m.s, env.prims->ZeroAt(b.output, b.elements, st.touched.data(), st.touched.size()));
  }
}

// The local half of the D sub-exchange: every D member's contribution into its slice of the
// staging buffer (DenseStep's choice of what to send).
void DensePrepare(const StepEnv& env, const std::vector<Member*>& d, FusedScratch* scratch,
                  const Lap& lap) {
  const int N = env.coll->size(), ranks = N * env.local_trainers;
  const float scale = 1.0f / static_cast<float>(ranks);
  const bool pow2 = (ranks & (ranks - 1)) == 0;
  size_t total = 0;
  for (Member* m : d) {
    m->offset = total;
    total += m->item->data->elements;
  }
  std::vector<float>& staging = scratch->staging;
  staging.resize(total);
  for (Member* m : d) {
    LocalDense(env, *m, scale, pow2, staging.data() + m->offset);
    lap(Phase::kReduceLocal);
  }
}

// The wire half of the D sub-exchange: one all-reduce of the staging buffer, split back.
void DenseSubExchange(const StepEnv& env, const std::vector<Member*>& d, FusedScratch* scratch,
                      const Lap& lap) {
  const int N = env.coll->size();
  std::vector<float>& staging = scratch->staging;
  const size_t total = staging.size();
  // One scale for the whole message when every member uses the same; otherwise the all-reduce
  // does not scale and each slice is scaled after it (x * 1 is exact, so either way every
  // element is sum * its member's scale, rounded once, as in DenseStep).
  float common = d.front()->post_scale;
  for (Member* m : d) {
    if (m->post_scale != common) common = 1.0f;
  }
  const absl::Status c = env.coll->AllReduceScaled(staging.data(), staging.data(), total, common);
  lap(Phase::kCollective);
  for (Member* m : d) {
    StepItem& item = *m->item;
    BucketData& b = *item.data;
    const size_t n = b.elements;
    Keep(&m->s, c);
    if (m->s.ok()) {
      float* slice = staging.data() + m->offset;
      if (m->post_scale != common) env.host_prims->Scale(slice, m->post_scale, n);
      Keep(&m->s, env.prims->Copy(b.output, slice, n));
    }
    if (item.sparse != nullptr && !b.on_device) {  // nothing left behind
      Keep(&m->s, env.prims->Fill(b.acc, 0.0f, n));
      item.sparse->output_dense = true;
      item.sparse->touched.clear();
    }
    RecordDense(n, N, item.rec);
  }
}

// IndexUnionSubExchange's value stage: every member's values at its union (`vals`, back to back,
// `total` of them, in place) summed over the nodes. --fp16_values: each member's values as
// SparseStep's AverageUnionValues sends them (float16, float32 sums in rank order, the average
// rounded once: element by element the same as alone; (*scaled)[j] set, the average is in vals); a
// member whose average is not finite goes again as float32, scaled first, as alone. Otherwise one
// float32 all-reduce of the sums (not scaled). False when a collective failed (every member keeps
// it).
bool SumUnionValues(const StepEnv& env, const std::vector<Member*>& a, float scale, float* vals,
                    size_t total, std::vector<char>* scaled) {
  Primitives* host = env.host_prims;
  const int N = env.coll->size();
  if (env.fp16_values && N > 1 && total > 0) {
    std::vector<float> avg(total);
    HalfAllReduceBytes hb;
    absl::Status s =
        HalfAllReduceScaled(env.coll, DType::kFloat16, vals, avg.data(), total, scale, &hb);
    if (!s.ok()) {
      for (Member* m : a) Keep(&m->s, s);
      return false;
    }
    std::vector<float> again;  // the members whose average did not fit, back to back
    for (size_t j = 0; j < a.size(); ++j) {
      Member* m = a[j];
      const size_t u = m->union_idx.size();
      float* v = vals + m->offset;
      const float* w = avg.data() + m->offset;
      if (u > 0) {  // what HalfAllReduceScaled of this member alone would have moved
        const uint64_t half_bytes = 4ull * (N - 1) * ((u + N - 1) / N);
        m->bytes_sent += half_bytes;
        m->bytes_received += half_bytes;
      }
      if (std::all_of(w, w + u, [](float x) { return std::isfinite(x); })) {
        std::copy(w, w + u, v);
        m->values_sent = DType::kFloat16;
      } else {
        host->Scale(v, scale, u);
        again.insert(again.end(), v, v + u);
      }
      (*scaled)[j] = 1;
    }
    if (!again.empty()) {
      s = env.coll->AllReduce(again.data(), again.size(), ElemType::kFloat32, ReduceOp::kSum);
      if (!s.ok()) {
        for (Member* m : a) Keep(&m->s, s);
        return false;
      }
      size_t off = 0;
      for (Member* m : a) {
        if (m->values_sent == DType::kFloat16) continue;
        const size_t u = m->union_idx.size();
        std::copy(again.data() + off, again.data() + off + u, vals + m->offset);
        off += u;
        if (u > 0) {
          m->bytes_sent += u * 4;
          m->bytes_received += u * 4;
        }
      }
    }
  } else if (N > 1 && total > 0) {
    absl::Status s = env.coll->AllReduce(vals, total, ElemType::kFloat32, ReduceOp::kSum);
    if (!s.ok()) {
      for (Member* m : a) Keep(&m->s, s);
      return false;
    }
    for (Member* m : a) {
      const size_t u = m->union_idx.size();
      if (u > 0) {
        m->bytes_sent += u * 4;
        m->bytes_received += u * 4;
      }
    }
  }
  return true;
}

void IndexUnionSubExchange(const StepEnv& env, uint64_t step, const std::vector<Member*>& a,
                           FusedScratch* scratch, const Lap& lap) {
  Primitives* host = env.host_prims;
  const int N = env.coll->size();
  std::vector<size_t> ends;
  scratch->send.clear();
  for (Member* m : a) {
    const BucketData& b = *m->item->data;
    const Selection& sel = m->item->sparse->sel;
    EncodeIndexChunk(b.id, step, static_cast<uint32_t>(b.elements), sel.idx, sel.scalars,
                     &scratch->send, env.index_encoding);
    ends.push_back(scratch->send.size());
  }
  if (!GatherChunks(env, step, /*index_only=*/true, a, ends, scratch)) return;
  // Per member the union (nodes' sets may overlap), then its acc at the union, back to back.
  size_t total = 0;
  for (Member* m : a) {
    SortedUnique(*m, &m->union_idx);
    m->offset = total;
    total += m->union_idx.size();
  }
  std::vector<float>& vals = scratch->values;
  vals.assign(total, 0.0f);
  for (Member* m : a) {
    const BucketData& b = *m->item->data;
    float* v = vals.data() + m->offset;
    if (m->s.ok() && !m->union_idx.empty()) {
      absl::Status g = host->Gather(b.acc, b.elements, m->union_idx.data(), m->union_idx.size(), v);
      if (!g.ok()) {
        std::fill(v, v + m->union_idx.size(), 0.0f);
        m->s = g;
      }
    }
  }
  const float scale = 1.0f / static_cast<float>(N * env.local_trainers);
  std::vector<char> scaled(a.size(), 0);
  if (!SumUnionValues(env, a, scale, vals.data(), total, &scaled)) return;
  lap(Phase::kCollective);
  for (size_t j = 0; j < a.size(); ++j) {
    Member* m = a[j];
    const BucketData& b = *m->item->data;
    const size_t u = m->union_idx.size();
    m->gathered_idx = m->union_idx;
    if (!m->s.ok()) continue;
    float* v = vals.data() + m->offset;
    // out is zero at every position of the union (zeroed in LocalSparse), so adding writes it.
    if (!scaled[j]) host->Scale(v, scale, u);
    Keep(&m->s, host->ScatterAdd(b.output, b.elements, m->union_idx.data(), v, u));
    m->touched = m->union_idx;
  }
}

void SparseGatherSubExchange(const StepEnv& env, uint64_t step, const std::vector<Member*>& bm,
                             FusedScratch* scratch, const Lap& lap) {
  Primitives* host = env.host_prims;
  std::vector<size_t> ends;
  scratch->send.clear();
  for (Member* m : bm) {
    const BucketData& b = *m->item->data;
    const Selection& sel = m->item->sparse->sel;
    m->values_sent = ValuesWire(env.fp16_values ? DType::kFloat16 : DType::kFloat32, sel.val);
    EncodeChunk(b.id, step, static_cast<uint32_t>(b.elements), sel.idx, sel.val, m->values_sent,
                sel.scalars, &scratch->send, env.index_encoding);
    ends.push_back(scratch->send.size());
  }
  // Every chunk of every node is validated before anything is written.
  const bool ok = GatherChunks(env, step, /*index_only=*/false, bm, ends, scratch);
  lap(Phase::kCollective);
  if (!ok) return;
  const float scale = 1.0f / static_cast<float>(env.coll->size() * env.local_trainers);
  for (Member* m : bm) {
    const BucketData& b = *m->item->data;
    if (!m->s.ok()) continue;
    for (DecodedChunk& c : m->in) {  // node order; the decoded values are this call's copy
      host->Scale(c.values.data(), scale, c.values.size());
      Keep(&m->s, host->ScatterAdd(b.output, b.elements, c.idx, c.values.data(), c.values.size()));
    }
    SortedUnique(*m, &m->touched);
  }
}

// After the sparse sub-exchanges: SparseStep's residual update, Update and record. The member's
// status holds the item's incoming status (its first failure), so it replaces it.
void FinishSparse(const StepEnv& env, Member& m, const Lap& lap) {
  // B's values went out rounded to float16 (--fp16_values, where they fit): what rounding took
  // off stays in the residual, which the selection zeroed there (as SparseStep does).
  const Selection& sel = m.item->sparse->sel;
  if (m.kind == MergeKind::kPatternB && m.s.ok() && env.error_feedback && IsHalf(m.values_sent)) {
    half::KeepRounding(m.values_sent, m.item->data->acc, sel.idx.data(), sel.val.data(),
                       sel.idx.size());
  }
  SparseExchangeResult res;
  res.values_sent = m.kind == MergeKind::kPatternA ? m.values_sent : DType::kFloat32;
  res.touched = std::move(m.touched);
  res.counts = std::move(m.counts);
  res.gathered_idx = std::move(m.gathered_idx);
  res.bytes_sent = m.bytes_sent;
  res.bytes_received = m.bytes_received;
  FinishSparseExchange(env, *m.item, std::move(m.s), &res, lap);
}

// The group's static checks (agreed inputs: every node reaches the same verdict).
absl::Status CheckGroup(absl::Span<StepItem> group, absl::Span<const MergeKind> kinds) {
  if (group.empty()) return absl::OkStatus();
  if (kinds.size() != group.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fused step: ", group.size(), " members but ", kinds.size(), " kinds"));
  }
  for (size_t i = 0; i < group.size(); ++i) {
    const StepItem& item = group[i];
    const uint64_t id = item.data->id;
    if (item.step != group[0].step) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fused step: bucket ", id, " is at step ", item.step, ", the group's head at step ",
          group[0].step, "; a group never crosses a step"));
    }
    if (kinds[i] == MergeKind::kProbe) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fused step: bucket ", id,
          " is probing (kind P); a probing bucket is exchanged alone (DenseStep/SparseStep)"));
    }
    if (kinds[i] == MergeKind::kDense) continue;
    if (item.sparse != nullptr && item.sparse->oktopk) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fused step: bucket ", id,
          " exchanges through Ok-Topk (--sparse_allreduce=oktopk); the fused B sub-exchange is "
          "the all-gather only"));
    }
    const Pattern want =
        kinds[i] == MergeKind::kPatternA ? Pattern::kIndexUnion : Pattern::kSparseGather;
    if (item.sparse == nullptr || item.sparse->compressor->pattern() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fused step: bucket ", id, " is of kind ", PatternName(want), " but its compressor is ",
          item.sparse == nullptr
              ? "none (a dense bucket)"
              : absl::StrCat(item.sparse->compressor->name(), " (pattern ",
                             PatternName(item.sparse->compressor->pattern()), ")")));
    }
  }
  return absl::OkStatus();
}

}  // namespace

struct FusedExchange::State {
  std::vector<Member> members;
  std::vector<Member*> d, a, b;
  FusedScratch* scratch = nullptr;
  uint64_t step = 0;
};

FusedExchange::FusedExchange() : state_(std::make_unique<State>()) {}
FusedExchange::~FusedExchange() = default;

void FusedExchange::Prepare(const StepEnv& env, absl::Span<StepItem> group,
                            absl::Span<const MergeKind> kinds, FusedScratch* scratch,
                            const Lap& lap) {
  State& st = *state_;
  st.members.clear();
  st.d.clear();
  st.a.clear();
  st.b.clear();
  st.scratch = scratch;
  if (absl::Status s = CheckGroup(group, kinds); !s.ok()) {
    for (StepItem& item : group) item.status = s;
    return;
  }
  if (group.empty()) return;
  st.step = group[0].step;
  st.members.resize(group.size());
  for (size_t i = 0; i < group.size(); ++i) {
    st.members[i].item = &group[i];
    st.members[i].kind = kinds[i];
    st.members[i].s = group[i].status;  // a failure of the local reduce (step.h)
    (kinds[i] == MergeKind::kDense      ? st.d
     : kinds[i] == MergeKind::kPatternA ? st.a
                                        : st.b)
        .push_back(&st.members[i]);
  }
  // Every sparse member selects first, in group order, as unmerged; then the D members are
  // reduced into the staging buffer.
  for (Member& m : st.members) {
    if (m.kind != MergeKind::kDense) LocalSparse(env, m, lap);
  }
  if (!st.d.empty()) DensePrepare(env, st.d, scratch, lap);
}

void FusedExchange::Exchange(const StepEnv& env, const Lap& lap) {
  State& st = *state_;
  if (st.members.empty()) return;  // an empty group, or refused by Prepare
  if (!st.d.empty()) DenseSubExchange(env, st.d, st.scratch, lap);
  if (!st.a.empty()) IndexUnionSubExchange(env, st.step, st.a, st.scratch, lap);
  if (!st.b.empty()) SparseGatherSubExchange(env, st.step, st.b, st.scratch, lap);
  for (Member& m : st.members) {
    if (m.kind == MergeKind::kDense) {
      if (m.item->status.ok()) m.item->status = m.s;
    } else {
      FinishSparse(env, m, lap);
    }
  }
  st.members.clear();
}

void FusedStep(const StepEnv& env, absl::Span<StepItem> group, absl::Span<const MergeKind> kinds,
               FusedScratch* scratch, const Lap& lap) {
  FusedExchange x;
  x.Prepare(env, group, kinds, scratch, lap);
  x.Exchange(env, lap);
}

}  // namespace spex
