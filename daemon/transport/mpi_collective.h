// Collective over MPI (host memory, one rank per node). Owns a duplicate of the communicator
// it is given, so its traffic never matches anyone else's. Also carries the out-of-band
// "this node is shutting down" notice between daemons (PeerNotice).
#pragma once

#include <mpi.h>

#include <memory>

#include "daemon/transport/collective.h"
#include "kernels/primitives.h"

namespace spex {

class MpiCollective : public Collective {
 public:
  // `scaler` (optional, not owned) does AllReduceScaled's scaling pass with its vectorised,
  // threaded Scale; without it the pass is a plain loop. `passive_wait`: AllReduce,
  // AllReduceScaled and AllGatherV run as their non-blocking forms, completed by MPI_Test with
  // short sleeps in between instead of MPI's busy polling, so a thread waiting on the wire
  // leaves its core to the threads computing beside it (the engine's wire stage,
  // --merge_overlap); the other collectives block as usual.
  explicit MpiCollective(MPI_Comm comm, Primitives* scaler = nullptr, bool passive_wait = false);
  ~MpiCollective() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }

  absl::Status AllReduce(void* data, size_t count, ElemType type, ReduceOp op) override;
  absl::Status AllReduceScaled(const float* send, float* recv, size_t count, float scale) override;
  absl::Status AllGather(const void* send, size_t bytes, void* recv) override;
  absl::Status AllGatherV(const void* send, size_t send_bytes, std::vector<size_t>* counts,
                          std::vector<uint8_t>* recv) override;
  // MPI_Alltoall of the block sizes, then one MPI_Alltoallv of the blocks: each rank receives
  // only what is addressed to it (the default moves every rank's blocks to every rank).
  absl::Status AllToAllV(const std::vector<std::vector<uint8_t>>& send,
                         std::vector<std::vector<uint8_t>>* recv) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;

 private:
  // Completes `req` (passive_wait), started by a call that returned `started`: that code
  // checked, then MPI_Test, a short spin, then sleeps of kPassiveSleepUs.
  absl::Status Finish(int started, MPI_Request* req, const char* what);

  MPI_Comm comm_;
  Primitives* scaler_ = nullptr;
  bool passive_wait_ = false;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> counts_, displs_;            // scratch for the v-collectives
  std::vector<int> send_counts_, send_displs_;  // scratch for AllToAllV's send side
  std::vector<uint8_t> send_buf_, recv_buf_;    // AllToAllV's contiguous blocks
};

// Shutdown notices between daemons on their own communicator: a node that stops tells all
// others; each polls (non-blocking) whether a peer has stopped. Call from one thread.
class PeerNotice {
 public:
  explicit PeerNotice(MPI_Comm comm);
  ~PeerNotice();
  void Announce();             // tell every other rank that this node is stopping
  bool PeerStopped(int* who);  // true once any other rank announced
  void Drain();                // completes outstanding requests before MPI_Finalize

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  int inbox_ = 0;
  MPI_Request recv_req_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> sends_;
  int payload_ = 1;
  bool announced_ = false;
};

}  // namespace spex
