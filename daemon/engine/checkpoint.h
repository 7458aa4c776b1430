// One bucket's part of a training checkpoint, so that a job stopped and restarted from its
// trainers' checkpoint resumes the exchange where it was instead of with empty residuals and
// fresh compressor controllers: the bucket's layout (id, elements, compressor and its
// parameters), the world it was saved in (nodes, this node's rank, local trainers), the density
// in effect, the step it was saved at, the error-feedback residual and the compressor's state blob
// (Compressor::SaveState). Encoded as a versioned, checksummed record; a record that does not
// fit the bucket it is loaded into is refused with what differs, never half applied.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/engine/bucket.h"

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
  // The bucket's next step when saved. Recorded, not applied: the engine's step count is the
  // trainers' (their shared header's), which starts again at 0 with the restarted trainers.
  uint64_t next_step = 0;
  std::vector<float> residual;   // elements floats; empty for a dense-only bucket
  std::string compressor_state;  // Compressor::SaveState; empty for a dense-only bucket
};

std::string EncodeBucketCheckpoint(const BucketCheckpoint& c);
// DataLoss for a truncated or corrupt record, FailedPrecondition for another format version.
absl::StatusOr<BucketCheckpoint> DecodeBucketCheckpoint(absl::string_view bytes);

// Takes a host bucket's checkpoint between steps (engine thread). Unimplemented for a device
// bucket and for a compressor that does not save its state.
absl::StatusOr<BucketCheckpoint> SaveBucket(const EngineBucket& b, const CheckpointWorld& world);

// Loads `c` into `b` (engine thread, between steps): residual, compressor state, density. Refused
// with FailedPrecondition naming both sides when the world (a different node count, rank or local
// trainers: a checkpoint is one node's residual and controller state, which do not split or merge),
// the bucket id, size, compressor or parameters differ; nothing of `b` changes then.
absl::Status RestoreBucket(const BucketCheckpoint& c, const CheckpointWorld& world,
                           EngineBucket* b);

}  // namespace spex
