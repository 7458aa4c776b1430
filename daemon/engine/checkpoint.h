// One bucket's part of a training checkpoint, so that a job stopped and restarted from its
// trainers' checkpoint resumes the exchange where it was instead of with empty residuals and
// fresh compressor controllers: the bucket's layout (id, elements, compressor and its
// parameters), the world it was saved in (nodes, this node's rank, local trainers), the density
// in effect, the step it was saved at, the engine's per-bucket choices (the dense-fallback probe,
// the sparse all-reduce and Ok-Topk's state), the error-feedback residual (float32, whatever the
// bucket's data type) and the compressor's state blob (Compressor::SaveState). Encoded as a
// versioned, checksummed record; a record that does not fit the bucket it is loaded into is
// refused with what differs, never half applied.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/engine/bucket.h"
#include "kernels/primitives.h"

namespace spex {

struct CheckpointWorld {
  int nodes = 1;
  int node_rank = 0;
  int local_trainers = 1;
  bool operator==(const CheckpointWorld& o) const {
    return nodes == o.nodes && node_rank == o.node_rank && local_trainers == o.local_trainers;
  }
};

struct BucketCheckpoint {
  CheckpointWorld world;
  uint64_t bucket_id = 0;
  uint64_t elements = 0;
  std::string compressor;
  std::map<std::string, std::string> params;
  double density = 1.0;
  // The bucket's policies as RegisterBucket set them ("nonfinite=.. sparse_allreduce=..
  // dense_fallback=.."): they decide how the saved choices below are used, so they must match.
  std::string policy;
  // The bucket's data type (DType: float32, bfloat16, float16). The residual is float32 whatever
  // it is; another type is refused all the same (the rounding into the output differs).
  uint32_t dtype = 0;
  // The step the bucket's compressor would see next (the trainers' step plus the bucket's
  // step_base). Restored as the new bucket's step_base, so that the compressor's step-dependent
  // choices (partition rotation, random streams, schedules) go on where they were although the
  // restarted trainers count their steps from 0 again.
  uint64_t next_step = 0;
  // The engine's per-bucket choices (BucketExchange): the dense-fallback probe and the
  // --sparse_allreduce=auto probe with their timings, the Ok-Topk choice and its state.
  uint8_t mode = 0;  // BucketExchange::Mode
  uint64_t probe_sparse_ns = 0, probe_dense_ns = 0;
  bool allreduce_probe = false;
  uint64_t allreduce_probed = 0, probe_allgather_ns = 0, probe_oktopk_ns = 0;
  bool oktopk = false;
  uint64_t oktopk_exchanges = 0;
  float oktopk_threshold = 0;
  std::vector<uint32_t> oktopk_bounds;
  std::vector<float> residual;   // elements floats; empty for a dense-only bucket
  std::string compressor_state;  // Compressor::SaveState; empty for a dense-only bucket
};

// What a record's fields may hold (DecodeBucketCheckpoint refuses more): a bucket's elements
// (RegisterBucket takes fewer than 2^32), its step (2^48 steps: decades of training at a step a
// microsecond), a probe's summed timing (2^53 ns: over 100 days).
inline constexpr uint64_t kMaxCheckpointElements = (uint64_t{1} << 32) - 1;
inline constexpr uint64_t kMaxCheckpointStep = uint64_t{1} << 48;
inline constexpr uint64_t kMaxCheckpointProbeNs = uint64_t{1} << 53;

std::string EncodeBucketCheckpoint(const BucketCheckpoint& c);
// DataLoss for a truncated or corrupt record, or one with a field out of the bounds above or of
// what a run produces (a world that is none, exchange counts beyond the step, Ok-Topk regions out
// of order, a non-finite residual or threshold); FailedPrecondition for another format version.
absl::StatusOr<BucketCheckpoint> DecodeBucketCheckpoint(absl::string_view bytes);

// The text BucketCheckpoint::policy holds for a bucket's policies.
std::string PolicyText(const BucketPolicy& p);

// Takes a bucket's checkpoint between steps (engine thread, or under the engine's mutex while
// the engine is not inside the bucket). `prims`: the bucket memory's primitives, which copy a
// device bucket's residual to the host (null: a device bucket is Unimplemented). Unimplemented
// for a compressor that does not save its state.
absl::StatusOr<BucketCheckpoint> SaveBucket(const EngineBucket& b, const CheckpointWorld& world,
                                            Primitives* prims = nullptr);

// Loads `c` into `b` (as SaveBucket, between steps): residual, compressor state, density, the
// engine's choices and the step base. Refused with FailedPrecondition naming both sides when the
// world (a different node count, rank or local trainers: a checkpoint is one node's residual and
// controller state; AddResizedBucket carries residuals onto another world), the bucket's size,
// compressor, parameters or policies differ, or resized records were added to it already; nothing
// of `b` changes then. The bucket id may differ (the caller says which record goes to which bucket:
// a DDP hook's ids change with DDP's bucket generations); the error messages name both. `prims` as
// for SaveBucket.
absl::Status RestoreBucket(const BucketCheckpoint& c, const CheckpointWorld& world, EngineBucket* b,
                           Primitives* prims = nullptr);

// A record of another world (other nodes or trainers per node) into a bucket of this one, before
// its first exchange: the world's unsent gradient mass carries over, nothing else does. The
// record's residual, scaled by (this world's nodes x trainers) / (the record's), is added to
// this bucket's residual at the elements this node takes (element i goes to node i mod nodes),
// so that loading every old node's record on every new node leaves each element's sum over the
// world, divided by the world's trainers (its share of the average it is exchanged into), as it
// was. The compressor's state, the engine's per-bucket choices and Ok-Topk's state, which are
// tied to the node count and rank that produced them, stay fresh; the density and the step
// (as the step base) are the record's. Checked as RestoreBucket checks (bucket size,
// compressor, parameters, policies, type, no exchange yet), and: every record added to a bucket
// is of one world and step, each old node's once; an exact restore and a resized one do not
// mix. Nothing of `b` changes when refused. A device bucket is Unimplemented.
absl::Status AddResizedBucket(const BucketCheckpoint& c, const CheckpointWorld& world,
                              EngineBucket* b);

}  // namespace spex
