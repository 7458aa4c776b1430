// The exchange seam (docs/design.md#seams): the few collectives the engine needs, over any
// transport. Implementations: MPI (host memory, one rank per node), in-process (threads as nodes,
// for tests) and NCCL (device memory). Every rank must call the same collectives in the same order.
// Calls block until complete; errors (a peer gone, a size mismatch) come back as a Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace spex {

enum class ReduceOp { kSum, kMax, kMin };
enum class ElemType { kFloat32, kFloat64, kInt64, kUint64 };

size_t ElemSize(ElemType t);

// acc[i] = acc[i] op x[i] for n elements of type t (an all-reduce's local step).
void Combine(void* acc, const void* x, size_t n, ElemType t, ReduceOp op);

// See Collective::SetComputeProbe. Called from the collective's thread during its waits.
class ComputeProbe {
 public:
  virtual ~ComputeProbe() = default;
  virtual bool Computing() const = 0;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Human-readable name for logs and stats ("mpi", "inproc", "nccl").
  virtual const char* name() const = 0;

  // In-place all-reduce of `count` elements.
  virtual absl::Status AllReduce(void* data, size_t count, ElemType type, ReduceOp op) = 0;

  // Sum-all-reduce of `count` floats from `send` into `recv`, then every element of `recv`
  // multiplied by `scale` (send may equal recv). The dense path of the engine; an
  // implementation may fuse the scaling into its reduction where that is faster.
  virtual absl::Status AllReduceScaled(const float* send, float* recv, size_t count,
                                       float scale) = 0;

  // Every rank contributes `bytes` bytes (the same number on every rank); `recv` gets
  // size() * bytes, rank r's block at r * bytes. `send` may be this rank's own block of `recv`
  // (recv + rank() * bytes: gathered in place); otherwise the two must not overlap.
  virtual absl::Status AllGather(const void* send, size_t bytes, void* recv) = 0;

  // Variable-size all-gather: rank r contributes send_bytes bytes; `counts` gets every rank's
  // byte count and `recv` the concatenation in rank order (resized as needed).
  virtual absl::Status AllGatherV(const void* send, size_t send_bytes, std::vector<size_t>* counts,
                                  std::vector<uint8_t>* recv) = 0;

  // Personalised exchange: send[r] goes to rank r (send.size() == size()); recv[r] gets what
  // rank r sent to this rank. The default is built on AllGatherV (every rank's blocks and their
  // sizes gathered, each rank keeps its own), so it is correct on every backend but moves
  // size() times the personalised volume; a backend overrides it with a real all-to-all
  // (MPI_Alltoallv) where the volume matters.
  virtual absl::Status AllToAllV(const std::vector<std::vector<uint8_t>>& send,
                                 std::vector<std::vector<uint8_t>>* recv);

  // Personalised exchange of equal blocks between contiguous buffers: block r of `send`
  // (size() blocks of block_bytes) goes to rank r, and `recv` (size() blocks, not overlapping
  // send) gets rank r's block for this rank at r * block_bytes. Every rank passes the same
  // block_bytes. The default goes through AllToAllV (copies into and out of its vectors); MPI
  // sends from and receives into the buffers themselves (MPI_Alltoall).
  virtual absl::Status AllToAll(const void* send, size_t block_bytes, void* recv);

  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual absl::Status Barrier() = 0;

  // Whether this node's trainers compute beside the caller now (later buckets of their step not
  // handed in yet), asked by a wait that could either poll (taking their CPU) or sleep. Backends
  // that can wait either way ask it (MpiCollective under MpiWaitPolicy::sleep_only_beside_compute);
  // the others ignore it. Not owned; null: nobody computes beside.
  virtual void SetComputeProbe(const ComputeProbe* probe) { (void)probe; }
};

}  // namespace spex
