// Collective over NCCL for device buffers (the GPU path of the Collective seam,
// docs/design.md#seams). The communicator is bootstrapped over another Collective (the daemon's MPI
// one): every rank reports whether its GPU is usable, rank 0 makes the ncclUniqueId and broadcasts
// it, and all ranks fail together (naming the ranks at fault) instead of hanging in
// ncclCommInitRank when one cannot join.
//
// Pointers: data/send/recv are device memory; host pointers are also accepted and staged
// through device scratch (cudaPointerGetAttributes decides), so the engine's small host-side
// control all-reduces work too. AllGatherV's `recv` is a host vector by the interface: chunks
// are gathered on the GPU, then copied to it once. Every call synchronises its stream.
//
// AllGatherV strategy (PlanAllGatherV): a padded ncclAllGather (every rank sends max(counts),
// NCCL's bandwidth-optimal ring) when padding wastes at most 1/8 of the bytes, otherwise grouped
// ncclSend/ncclRecv of exactly counts[r] bytes per peer (ncclGroupStart/End).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/transport/collective.h"

namespace spex {

// Bytes in an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
inline constexpr size_t kNcclUniqueIdBytes = 128;

// How AllGatherV moves `counts` bytes per rank.
struct AllGatherVPlan {
  bool padded = false;         // one ncclAllGather of block bytes per rank
  size_t block = 0;            // max(counts): the padded block size
  size_t total = 0;            // sum(counts)
  std::vector<size_t> displs;  // rank r's chunk starts at displs[r] in the packed result
};
AllGatherVPlan PlanAllGatherV(const std::vector<size_t>& counts);

// The bootstrap agreement, on `bootstrap` (every rank calls it together): each rank passes
// whether its GPU is ready (`local`); if all are, rank 0 calls `make_id` and broadcasts the id.
// Every rank returns the same outcome: the id, or FailedPrecondition naming the ranks that
// were not ready (with this rank's own reason) or saying that rank 0 could not make an id.
absl::StatusOr<std::string> AgreeOnNcclId(
    Collective* bootstrap, const absl::Status& local,
    const std::function<absl::StatusOr<std::string>()>& make_id);

// A Collective over NCCL on GPU `device` with bootstrap->size() ranks (same rank order).
// Collective over all ranks of `bootstrap`: every rank must call it. Without --config=cuda
// every rank gets FailedPrecondition ("built without CUDA") after the agreement step.
absl::StatusOr<std::unique_ptr<Collective>> MakeNcclCollective(Collective* bootstrap, int device);

}  // namespace spex
