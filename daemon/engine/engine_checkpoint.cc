// The engine's checkpoint requests from the RPC threads (engine.h: SaveBucketState,
// LoadBucketState): a bucket's record (checkpoint.h) is copied or applied under the engine's
// mutex while the bucket is between steps, so the engine thread never sees half of it; encoding
// and decoding run outside the mutex.
#include "absl/strings/str_cat.h"
#include "daemon/engine/checkpoint.h"
#include "daemon/engine/engine.h"
#include "daemon/util/log.h"

namespace spex {

absl::StatusOr<EngineBucket*> Engine::BucketBetweenStepsLocked(uint64_t session_id,
                                                               uint64_t bucket_id,
                                                               const char* what) {
  if (options_.merger == MergerPolicy::kOmgs
          ? options_.merge.omgs_select_behind
          : options_.merger == MergerPolicy::kRgmerge && options_.merge.rgmerge_select_behind) {
    return absl::UnimplementedError(absl::StrCat(
        "bucket ", bucket_id, ": ", what,
        " is not supported with selection behind (a plan group's buckets share one compressor); "
        "start spexd with --omgs_select=ahead / --rgmerge_select=ahead to checkpoint"));
  }
  for (;;) {
    absl::StatusOr<Session*> session = sessions_.Get(session_id);
    if (!session.ok()) return session.status();
    const uint32_t rank = (*session)->local_rank;
    EngineBucket* b = buckets_.Find(bucket_id);
    if (b == nullptr || !(b->out.registered_mask & (1ull << rank))) {
      return absl::NotFoundError(absl::StrCat("bucket ", bucket_id,
                                              " is not registered by this session; call "
                                              "RegisterBucket before ",
                                              what));
    }
    if (b->out.state == BucketState::kFailed) {
      return absl::FailedPreconditionError(
          absl::StrCat("bucket ", bucket_id, " failed at step ", b->out.error_step,
                       " and its state is unknown (", b->out.error.message(),
                       "); restart the job from an earlier checkpoint"));
    }
    const uint64_t mine = b->mem.header->ready[rank].value.load();
    if (mine != b->ex.next_step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "bucket ", bucket_id, ": ", what, " between steps only: this trainer's next step is ",
          mine, ", the bucket's ", b->ex.next_step,
          "; wait for the result of every step handed in before saving or loading"));
    }
    // The caller saw its last result, whose publish may not have finished here yet.
    if (b->out.completed == b->ex.next_step) return b;
    if (stop_) return absl::UnavailableError("spexd is shutting down");
    published_cv_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
  }
}

absl::StatusOr<std::string> Engine::SaveBucketState(uint64_t session_id, uint64_t bucket_id) {
  absl::StatusOr<BucketCheckpoint> c;
  {
    // Only the copy (the residual and the compressor's state) under the lock: every exchange of
    // the node waits while it is held.
    absl::MutexLock lock(&mu_);
    absl::StatusOr<EngineBucket*> b = BucketBetweenStepsLocked(session_id, bucket_id, "saving");
    if (!b.ok()) return b.status();
    const CheckpointWorld world{collective_->size(), collective_->rank(), options_.local_trainers};
    c = SaveBucket(**b, world, prims_);
  }
  if (!c.ok()) return c.status();
  if (save_copied_hook_) save_copied_hook_();
  // Encoding and sealing (another copy and a checksum over up to hundreds of MB) from the copy,
  // while the node's exchanges go on.
  return EncodeBucketCheckpoint(*c);
}

absl::Status Engine::LoadBucketState(uint64_t session_id, uint64_t bucket_id,
                                     absl::string_view record, bool resize) {
  // Decoding (a checksum over up to hundreds of MB) needs no lock.
  absl::StatusOr<BucketCheckpoint> c = DecodeBucketCheckpoint(record);
  if (!c.ok()) {
    return absl::Status(c.status().code(),
                        absl::StrCat("bucket ", bucket_id, ": ", c.status().message()));
  }
  absl::MutexLock lock(&mu_);
  absl::StatusOr<EngineBucket*> b = BucketBetweenStepsLocked(session_id, bucket_id, "loading");
  if (!b.ok()) return b.status();
  const CheckpointWorld world{collective_->size(), collective_->rank(), options_.local_trainers};
  if (resize) {
    if (absl::Status s = AddResizedBucket(*c, world, *b); !s.ok()) return s;
    SPEX_LOG(WARNING) << "bucket " << bucket_id << ": residual of node " << c->world.node_rank
                      << " of " << c->world.nodes << " (" << c->world.local_trainers
                      << " trainer(s) per node) saved at step " << c->next_step
                      << " added for this world of " << world.nodes << " x " << world.local_trainers
                      << " (elements i with i mod " << world.nodes << " = " << world.node_rank
                      << ", scaled by the ratio of the worlds' "
                      << "trainers); its compressor (" << c->compressor
                      << ") and the engine's choices start afresh: not an exact resume";
    return absl::OkStatus();
  }
  if (absl::Status s = RestoreBucket(*c, world, *b, prims_); !s.ok()) return s;
  SPEX_LOG(INFO) << "bucket " << bucket_id << ": state loaded from a checkpoint of bucket "
                 << c->bucket_id << " saved at step " << c->next_step;
  return absl::OkStatus();
}

}  // namespace spex
