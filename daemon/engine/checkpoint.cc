// Encoding, decoding and applying one bucket's checkpoint record (checkpoint.h).
#include "daemon/engine/checkpoint.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/compressors/state_blob.h"
#include "kernels/half.h"
#include "proto/contract/layout.h"

namespace spex {
namespace {

constexpr uint32_t kCheckpointMagic = 0x4b435053;  // "SPCK"
constexpr uint16_t kCheckpointVersion = 2;
constexpr uint64_t kMaxName = 1 << 12;

std::string WorldText(const CheckpointWorld& w) {
  return absl::StrCat("node ", w.node_rank, " of ", w.nodes, " with ", w.local_trainers,
                      " local trainer(s)");
}

std::string ParamsText(const std::map<std::string, std::string>& p) {
  return p.empty() ? "none" : absl::StrJoin(p, ",", absl::PairFormatter("="));
}

std::string PolicyOrNone(const std::string& p) { return p.empty() ? "none" : p; }

// The first field of a decoded record that no run can have produced, described; empty when
// every field is within bounds.
std::string OutOfBounds(const BucketCheckpoint& c, int32_t nodes, int32_t rank, int32_t local) {
  if (nodes < 1 || rank < 0 || rank >= nodes || local < 1 ||
      local > static_cast<int32_t>(kMaxLocalTrainers)) {
    return absl::StrCat("world node ", rank, " of ", nodes, " with ", local,
                        " local trainer(s) is not a world");
  }
  if (c.elements == 0 || c.elements > kMaxCheckpointElements) {
    return absl::StrCat("bucket size ", c.elements, " out of 1..", kMaxCheckpointElements);
  }
  if (c.next_step > kMaxCheckpointStep) {
    return absl::StrCat("step ", c.next_step, " beyond ", kMaxCheckpointStep);
  }
  for (uint64_t ns :
       {c.probe_sparse_ns, c.probe_dense_ns, c.probe_allgather_ns, c.probe_oktopk_ns}) {
    if (ns > kMaxCheckpointProbeNs) {
      return absl::StrCat("a probe timing of ", ns, " ns beyond ", kMaxCheckpointProbeNs);
    }
  }
  // Counts of exchanges the bucket ran: no more than its steps.
  if (c.allreduce_probed > c.next_step || c.oktopk_exchanges > c.next_step) {
    return absl::StrCat("exchange counts (", c.allreduce_probed, " probed, ", c.oktopk_exchanges,
                        " Ok-Topk) beyond the record's step ", c.next_step);
  }
  if (!std::isfinite(c.oktopk_threshold) || c.oktopk_threshold < 0) {
    return absl::StrCat("Ok-Topk threshold ", c.oktopk_threshold, " is not a finite magnitude");
  }
  if (!c.oktopk_bounds.empty()) {
    bool ordered = c.oktopk_bounds.front() == 0 && c.oktopk_bounds.back() == c.elements;
    for (size_t i = 1; ordered && i < c.oktopk_bounds.size(); ++i) {
      ordered = c.oktopk_bounds[i - 1] <= c.oktopk_bounds[i];
    }
    if (!ordered) {
      return absl::StrCat("Ok-Topk regions do not run in order from 0 to ", c.elements);
    }
  }
  if (!c.residual.empty() && c.residual.size() != c.elements) {
    return absl::StrCat("residual of ", c.residual.size(), " values for ", c.elements, " elements");
  }
  // The engine never keeps a non-finite remainder (a step with one changes no residual).
  for (size_t i = 0; i < c.residual.size(); ++i) {
    if (!std::isfinite(c.residual[i])) {
      return absl::StrCat("residual value ", c.residual[i], " at index ", i, " is not finite");
    }
  }
  return "";
}

}  // namespace

std::string PolicyText(const BucketPolicy& p) {
  return absl::StrCat(kBucketParamNonfinite, "=", AbslUnparseFlag(p.nonfinite), " ",
                      kBucketParamSparseAllreduce, "=", AbslUnparseFlag(p.sparse_allreduce), " ",
                      kBucketParamDenseFallback, "=", AbslUnparseFlag(p.dense_fallback));
}

std::string EncodeBucketCheckpoint(const BucketCheckpoint& c) {
  StateWriter w;
  w.Put<uint32_t>(kCheckpointMagic);
  w.Put<uint16_t>(kCheckpointVersion);
  w.Put<int32_t>(c.world.nodes);
  w.Put<int32_t>(c.world.node_rank);
  w.Put<int32_t>(c.world.local_trainers);
  w.Put<uint64_t>(c.bucket_id);
  w.Put<uint64_t>(c.elements);
  w.PutString(c.compressor);
  w.Put<uint64_t>(c.params.size());
  for (const auto& [k, v] : c.params) {
    w.PutString(k);
    w.PutString(v);
  }
  w.Put<double>(c.density);
  w.PutString(c.policy);
  w.Put<uint32_t>(c.dtype);
  w.Put<uint64_t>(c.next_step);
  w.Put<uint8_t>(c.mode);
  w.Put<uint64_t>(c.probe_sparse_ns);
  w.Put<uint64_t>(c.probe_dense_ns);
  w.Put<uint8_t>(c.allreduce_probe ? 1 : 0);
  w.Put<uint64_t>(c.allreduce_probed);
  w.Put<uint64_t>(c.probe_allgather_ns);
  w.Put<uint64_t>(c.probe_oktopk_ns);
  w.Put<uint8_t>(c.oktopk ? 1 : 0);
  w.Put<uint64_t>(c.oktopk_exchanges);
  w.Put<float>(c.oktopk_threshold);
  w.PutVector(c.oktopk_bounds);
  w.PutVector(c.residual);
  w.PutString(c.compressor_state);
  w.Seal();
  return std::move(w.bytes());
}

absl::StatusOr<BucketCheckpoint> DecodeBucketCheckpoint(absl::string_view bytes) {
  if (bytes.size() < 6 + 8) {
    return absl::DataLossError(
        absl::StrCat("bucket checkpoint: truncated (", bytes.size(), " bytes)"));
  }
  const absl::string_view body = SealedBody(bytes);
  StateReader r(body);
  uint32_t magic = 0;
  uint16_t version = 0;
  r.Get(&magic);
  r.Get(&version);
  if (magic != kCheckpointMagic) {
    return absl::InvalidArgumentError("bucket checkpoint: not a spex checkpoint (bad magic)");
  }
  if (version != kCheckpointVersion) {
    return absl::FailedPreconditionError(absl::StrCat("bucket checkpoint: saved in format version ",
                                                      version, "; this spexd reads version ",
                                                      kCheckpointVersion));
  }
  if (!SealIntact(bytes)) {
    return absl::DataLossError(
        "bucket checkpoint: checksum mismatch (the file is corrupt or truncated)");
  }
  BucketCheckpoint c;
  int32_t nodes = 0, rank = 0, local = 0;
  uint64_t nparams = 0;
  r.Get(&nodes);
  r.Get(&rank);
  r.Get(&local);
  r.Get(&c.bucket_id);
  r.Get(&c.elements);
  r.GetString(&c.compressor, kMaxName);
  r.Get(&nparams);
  for (uint64_t i = 0; r.ok() && i < nparams; ++i) {
    std::string k, v;
    if (r.GetString(&k, kMaxName) && r.GetString(&v, kMaxName)) c.params[k] = v;
  }
  uint8_t allreduce_probe = 0, oktopk = 0;
  r.Get(&c.density);
  r.GetString(&c.policy, kMaxName);
  r.Get(&c.dtype);
  r.Get(&c.next_step);
  r.Get(&c.mode);
  r.Get(&c.probe_sparse_ns);
  r.Get(&c.probe_dense_ns);
  r.Get(&allreduce_probe);
  r.Get(&c.allreduce_probed);
  r.Get(&c.probe_allgather_ns);
  r.Get(&c.probe_oktopk_ns);
  r.Get(&oktopk);
  r.Get(&c.oktopk_exchanges);
  r.Get(&c.oktopk_threshold);
  r.GetVector(&c.oktopk_bounds, c.elements + 1);
  r.GetVector(&c.residual, c.elements);
  r.GetString(&c.compressor_state, body.size());
  if (!r.complete()) return absl::DataLossError("bucket checkpoint: malformed record");
  if (c.mode > static_cast<uint8_t>(BucketExchange::Mode::kDense) || allreduce_probe > 1 ||
      oktopk > 1 || !(c.density > 0 && c.density <= 1) ||
      c.dtype > static_cast<uint32_t>(DType::kFloat16)) {
    return absl::DataLossError("bucket checkpoint: a field is out of range (corrupt record)");
  }
  // The seal is a checksum, not a signature: whoever can write the file can rewrite a field and
  // seal it again. Every field is bounded by what a run can have produced, so a rewritten record
  // can at worst restore a state a run might have reached.
  if (std::string bad = OutOfBounds(c, nodes, rank, local); !bad.empty()) {
    return absl::DataLossError(
        absl::StrCat("bucket checkpoint: ", bad, " (not a record spexd wrote; corrupt or forged)"));
  }
  c.allreduce_probe = allreduce_probe == 1;
  c.oktopk = oktopk == 1;
  c.world = {nodes, rank, local};
  return c;
}

absl::StatusOr<BucketCheckpoint> SaveBucket(const EngineBucket& b, const CheckpointWorld& world,
                                            Primitives* prims) {
  if (b.mem.view.on_device && prims == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("bucket ", b.id, ": checkpointing a device bucket needs its primitives"));
  }
  BucketCheckpoint c;
  c.world = world;
  c.bucket_id = b.id;
  c.elements = b.elements;
  c.compressor = b.compressor;
  c.params = b.params;
  c.density = b.out.density;
  c.policy = PolicyText(b.policy);
  c.dtype = static_cast<uint32_t>(b.mem.view.dtype);
  c.next_step = b.ex.compute_step();
  c.mode = static_cast<uint8_t>(b.ex.mode);
  c.probe_sparse_ns = b.ex.probe_sparse_ns;
  c.probe_dense_ns = b.ex.probe_dense_ns;
  c.allreduce_probe = b.ex.allreduce_probe;
  c.allreduce_probed = b.ex.allreduce_probed;
  c.probe_allgather_ns = b.ex.probe_allgather_ns;
  c.probe_oktopk_ns = b.ex.probe_oktopk_ns;
  if (b.ex.sparse != nullptr) {
    const SparseState& st = *b.ex.sparse;
    absl::StatusOr<std::string> state = st.compressor->SaveState();
    if (!state.ok()) return state.status();
    c.compressor_state = std::move(*state);
    c.oktopk = st.oktopk;
    c.oktopk_exchanges = st.oktopk_state.exchanges;
    c.oktopk_threshold = st.oktopk_state.threshold;
    c.oktopk_bounds = st.oktopk_state.bounds;
    c.residual.resize(b.elements);
    if (b.mem.view.on_device) {
      if (absl::Status s =
              prims->CopyToHost(c.residual.data(), b.mem.view.acc, b.elements * sizeof(float));
          !s.ok()) {
        return absl::Status(
            s.code(),
            absl::StrCat("bucket ", b.id, ": copying the residual from the device: ", s.message()));
      }
    } else {
      std::memcpy(c.residual.data(), b.mem.view.acc, b.elements * sizeof(float));
    }
  }
  return c;
}

namespace {

// RestoreBucket's first stage: whether the record fits this bucket at all (same world, bucket,
// compressor, policy and type, and no exchange run yet). Changes nothing.
absl::Status CheckRestorable(const BucketCheckpoint& c, const CheckpointWorld& world,
                             const EngineBucket* b, Primitives* prims, const std::string& what,
                             bool resized = false) {
  if (!resized && !(c.world == world)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, "the checkpoint was saved by ", WorldText(c.world), ", this daemon is ",
        WorldText(world),
        "; restart with the same nodes and trainers per node, or start this bucket fresh"));
  }
  if (c.elements != b->elements) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "the checkpoint is of bucket ", c.bucket_id, " (", c.elements,
                     " elements), this is bucket ", b->id, " (", b->elements,
                     " elements); register the buckets as they were when it was saved"));
  }
  if (c.compressor != b->compressor || c.params != b->params) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "the checkpoint (of bucket ", c.bucket_id, ") used compressor ",
                     c.compressor, " (", ParamsText(c.params), "), this bucket uses ",
                     b->compressor, " (", ParamsText(b->params), ")"));
  }
  if (resized ? b->restored.exact : b->restored.nodes != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        resized ? "a checkpoint of this world was loaded into this bucket already"
                : "records of another world were added to this bucket already",
        "; an exact restore and a resized one do not mix: load one checkpoint, every node's "
        "records of it"));
  }
  if (const std::string policy = PolicyText(b->policy); c.policy != policy) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "the checkpoint (of bucket ", c.bucket_id, ") was saved with ",
                     PolicyOrNone(c.policy), ", this bucket has ", policy,
                     " (spexd flags or bucket parameters): use the same as when it was saved"));
  }
  if (c.dtype != static_cast<uint32_t>(b->mem.view.dtype)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, "the checkpoint (of bucket ", c.bucket_id, ") is of a ",
        DTypeName(static_cast<DType>(c.dtype)), " bucket, this one is ",
        DTypeName(b->mem.view.dtype), ": register it with the type it was saved with"));
  }
  if (b->mem.view.on_device && prims == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat(what, "restoring a device bucket needs its primitives"));
  }
  if ((b->ex.sparse != nullptr) != !c.compressor_state.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, "the checkpoint (of bucket ", c.bucket_id, ") is of a ",
        c.compressor_state.empty() ? "dense" : "sparse", " bucket, this one is ",
        b->ex.sparse != nullptr ? "sparse" : "dense",
        " (spexd's --min_sparse_elements or --compressor differ from when it was saved)"));
  }
  // Only a bucket that has not exchanged yet: one that has would mix the record's residual and
  // controller state into a run that already moved on from its own (and its step base would
  // shift the compressor's steps under the trainers' feet).
  if (b->ex.next_step != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, "the checkpoint was saved at step ", c.next_step, ", this bucket has run ",
        b->ex.next_step,
        " step(s) already: load a checkpoint before the bucket's first exchange (as a restarted "
        "job does)"));
  }
  return absl::OkStatus();
}

// RestoreBucket's second stage, for a sparse bucket: the residual, the compressor's state and
// Ok-Topk's, all or nothing.
absl::Status RestoreSparse(const BucketCheckpoint& c, const CheckpointWorld& world, EngineBucket* b,
                           Primitives* prims, const std::string& what) {
  if (c.residual.size() != b->elements) {
    return absl::DataLossError(absl::StrCat(what, "the checkpoint's residual has ",
                                            c.residual.size(), " of ", b->elements, " elements"));
  }
  if (!c.oktopk_bounds.empty() && c.oktopk_bounds.size() != static_cast<size_t>(world.nodes) + 1) {
    return absl::DataLossError(absl::StrCat(what, "the checkpoint's Ok-Topk regions have ",
                                            c.oktopk_bounds.size(), " bounds for ", world.nodes,
                                            " nodes"));
  }
  // LoadState validates everything before it changes anything, so it goes first; the device
  // copy next (a failure there leaves a loaded compressor over the old residual, so the
  // compressor is put back from its own saved state).
  absl::StatusOr<std::string> before = b->ex.sparse->compressor->SaveState();
  if (!before.ok()) return before.status();
  if (absl::Status s = b->ex.sparse->compressor->LoadState(c.compressor_state); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what, s.message()));
  }
  if (b->mem.view.on_device) {
    if (absl::Status s = prims->CopyFromHost(b->mem.view.acc, c.residual.data(),
                                             c.residual.size() * sizeof(float));
        !s.ok()) {
      b->ex.sparse->compressor->LoadState(*before).IgnoreError();
      return absl::Status(s.code(),
                          absl::StrCat(what, "copying the residual to the device: ", s.message()));
    }
  } else {
    std::memcpy(b->mem.view.acc, c.residual.data(), c.residual.size() * sizeof(float));
  }
  SparseState& st = *b->ex.sparse;
  st.oktopk = c.oktopk;
  st.oktopk_state.exchanges = c.oktopk_exchanges;
  st.oktopk_state.threshold = c.oktopk_threshold;
  st.oktopk_state.bounds = c.oktopk_bounds;
  return absl::OkStatus();
}

}  // namespace

absl::Status RestoreBucket(const BucketCheckpoint& c, const CheckpointWorld& world, EngineBucket* b,
                           Primitives* prims) {
  const std::string what = absl::StrCat("bucket ", b->id, ": ");
  if (absl::Status s = CheckRestorable(c, world, b, prims, what); !s.ok()) return s;
  if (b->ex.sparse != nullptr) {
    if (absl::Status s = RestoreSparse(c, world, b, prims, what); !s.ok()) return s;
  }
  b->ex.mode = static_cast<BucketExchange::Mode>(c.mode);
  b->ex.probe_sparse_ns = c.probe_sparse_ns;
  b->ex.probe_dense_ns = c.probe_dense_ns;
  b->ex.allreduce_probe = c.allreduce_probe;
  b->ex.allreduce_probed = c.allreduce_probed;
  b->ex.probe_allgather_ns = c.probe_allgather_ns;
  b->ex.probe_oktopk_ns = c.probe_oktopk_ns;
  b->ex.step_base = c.next_step - b->ex.next_step;
  b->ex.reduced_step = UINT64_MAX;  // a merge group's kept sum holds the old residual
  b->out.density = c.density;
  b->restored.exact = true;
  return absl::OkStatus();
}

absl::Status AddResizedBucket(const BucketCheckpoint& c, const CheckpointWorld& world,
                              EngineBucket* b) {
  const std::string what = absl::StrCat("bucket ", b->id, ": ");
  if (b->mem.view.on_device) {
    return absl::UnimplementedError(absl::StrCat(
        what,
        "loading a checkpoint of another world into a device bucket is not implemented; resume "
        "on the saved nodes and trainers per node, or start the bucket fresh"));
  }
  if (absl::Status s = CheckRestorable(c, world, b, nullptr, what, /*resized=*/true); !s.ok()) {
    return s;
  }
  EngineBucket::Restored& r = b->restored;
  if (r.nodes != 0 && (r.nodes != c.world.nodes || r.local_trainers != c.world.local_trainers ||
                       r.step != c.next_step)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, "the record of ", WorldText(c.world), " saved at step ", c.next_step,
        " is not of the checkpoint added before (", r.nodes, " node(s) with ", r.local_trainers,
        " local trainer(s), step ", r.step, "): add every node's record of one checkpoint"));
  }
  if (r.from.count(c.world.node_rank) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "the record of ", WorldText(c.world),
                     " was added already (each old node's residual is added once)"));
  }
  if (b->ex.sparse != nullptr) {
    if (c.residual.size() != b->elements) {
      return absl::DataLossError(absl::StrCat(what, "the checkpoint's residual has ",
                                              c.residual.size(), " of ", b->elements, " elements"));
    }
    // The residual is a node's sum over its trainers, the exchange's result their average over
    // the world: scaled by the ratio of the worlds' trainers, each element's share of the
    // average stays as it was.
    const double scale = static_cast<double>(world.nodes) * world.local_trainers /
                         (static_cast<double>(c.world.nodes) * c.world.local_trainers);
    float* acc = b->mem.view.acc;
    const uint64_t first = static_cast<uint64_t>(world.node_rank);
    const uint64_t stride = static_cast<uint64_t>(world.nodes);
    // The engine never keeps a non-finite remainder: a sum past float's range (only a rewritten
    // record gets there) is refused before anything changes.
    for (uint64_t i = first; i < b->elements; i += stride) {
      if (!std::isfinite(acc[i] + static_cast<float>(c.residual[i] * scale))) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, "the record of ", WorldText(c.world), " takes the residual at index ", i,
            " past float's range on this world (x", scale, "): not a record spexd wrote"));
      }
    }
    if (c.density != b->out.density) {
      if (absl::Status s = b->ex.sparse->compressor->SetDensity(c.density); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(what, s.message()));
      }
    }
    for (uint64_t i = first; i < b->elements; i += stride) {
      acc[i] += static_cast<float>(c.residual[i] * scale);
    }
  }
  r.nodes = c.world.nodes;
  r.local_trainers = c.world.local_trainers;
  r.step = c.next_step;
  r.from.insert(c.world.node_rank);
  b->ex.step_base = c.next_step - b->ex.next_step;
  b->ex.reduced_step = UINT64_MAX;
  b->out.density = c.density;
  return absl::OkStatus();
}

}  // namespace spex
