// Encoding, decoding and applying one bucket's checkpoint record (checkpoint.h).
#include "daemon/engine/checkpoint.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/compressors/state_blob.h"

namespace spex {
namespace {

constexpr uint32_t kCheckpointMagic = 0x4b435053;  // "SPCK"
constexpr uint16_t kCheckpointVersion = 1;
constexpr uint64_t kMaxName = 1 << 12;

std::string WorldText(const CheckpointWorld& w) {
  return absl::StrCat("node ", w.node_rank, " of ", w.nodes, " with ", w.local_trainers,
                      " local trainer(s)");
}

std::string ParamsText(const std::map<std::string, std::string>& p) {
  return p.empty() ? "none" : absl::StrJoin(p, ",", absl::PairFormatter("="));
}

}  // namespace

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
  w.Put<uint64_t>(c.next_step);
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
  r.Get(&c.density);
  r.Get(&c.next_step);
  r.GetVector(&c.residual, c.elements);
  r.GetString(&c.compressor_state, body.size());
  if (!r.complete()) return absl::DataLossError("bucket checkpoint: malformed record");
  c.world = {nodes, rank, local};
  return c;
}

absl::StatusOr<BucketCheckpoint> SaveBucket(const EngineBucket& b, const CheckpointWorld& world) {
  if (b.mem.view.on_device) {
    return absl::UnimplementedError(
        absl::StrCat("bucket ", b.id, ": checkpointing a device bucket is not supported yet"));
  }
  BucketCheckpoint c;
  c.world = world;
  c.bucket_id = b.id;
  c.elements = b.elements;
  c.compressor = b.compressor;
  c.params = b.params;
  c.density = b.out.density;
  c.next_step = b.ex.next_step;
  if (b.ex.sparse != nullptr) {
    absl::StatusOr<std::string> state = b.ex.sparse->compressor->SaveState();
    if (!state.ok()) return state.status();
    c.compressor_state = std::move(*state);
    c.residual.assign(b.mem.view.acc, b.mem.view.acc + b.elements);
  }
  return c;
}

absl::Status RestoreBucket(const BucketCheckpoint& c, const CheckpointWorld& world,
                           EngineBucket* b) {
  const std::string what = absl::StrCat("bucket ", b->id, ": ");
  if (!(c.world == world)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, "the checkpoint was saved by ", WorldText(c.world), ", this daemon is ",
        WorldText(world),
        "; restart with the same nodes and trainers per node, or start this bucket fresh"));
  }
  if (c.bucket_id != b->id || c.elements != b->elements) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "the checkpoint is of bucket ", c.bucket_id, " (", c.elements,
                     " elements), this is bucket ", b->id, " (", b->elements,
                     " elements); register the buckets as they were when it was saved"));
  }
  if (c.compressor != b->compressor || c.params != b->params) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, "the checkpoint used compressor ", c.compressor, " (", ParamsText(c.params),
        "), this bucket uses ", b->compressor, " (", ParamsText(b->params), ")"));
  }
  if (b->mem.view.on_device) {
    return absl::UnimplementedError(
        absl::StrCat(what, "restoring a device bucket is not supported yet"));
  }
  if ((b->ex.sparse != nullptr) != !c.compressor_state.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "the checkpoint and this bucket differ in being sparse"));
  }
  if (b->ex.sparse != nullptr) {
    if (c.residual.size() != b->elements) {
      return absl::DataLossError(absl::StrCat(what, "the checkpoint's residual has ",
                                              c.residual.size(), " of ", b->elements, " elements"));
    }
    // LoadState validates everything before it changes anything, so it goes first.
    if (absl::Status s = b->ex.sparse->compressor->LoadState(c.compressor_state); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(what, s.message()));
    }
    std::memcpy(b->mem.view.acc, c.residual.data(), c.residual.size() * sizeof(float));
  }
  b->out.density = c.density;
  return absl::OkStatus();
}

}  // namespace spex
