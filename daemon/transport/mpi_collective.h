// Collective over MPI (host memory, one rank per node). Owns a duplicate of the communicator
// it is given, so its traffic never matches anyone else's. Also carries the out-of-band
// "this node is shutting down" notice between daemons (PeerNotice).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "daemon/transport/collective.h"
#include "kernels/primitives.h"

namespace spex {

// How MpiCollective waits for one collective: inside MPI (the blocking form; Open MPI polls, a
// core busy for the whole wait) or passively (the non-blocking form, completed by MPI_Test
// between sleeps of PassiveSleepUs). Passive when `max_sleep_us` > 0 and the collective's
// receive buffer holds at least `passive_min_bytes`: a large collective's wait is long (the wire
// time of its bytes), so polling through it takes a core from the trainers, while a small one's
// wait is short and Open MPI's non-blocking forms take more rounds for it (each paying the
// link's latency) than the blocking ones. The choice depends only on sizes every rank knows
// alike (the count of an all-reduce, the gathered total of an all-gather), so every rank
// issues the same form: a blocking collective never matches a non-blocking one.
struct MpiWaitPolicy {
  int64_t max_sleep_us = 0;       // 0: every collective waits inside MPI
  int64_t passive_min_bytes = 0;  // smaller collectives wait inside MPI; 0: every one passive
  // Every collective non-blocking (sizes ignored), and a wait sleeps between its MPI_Tests while
  // the trainers compute beside it (Collective::SetComputeProbe); otherwise it tests without
  // sleeping for its first 10 ms, then sleeps as usual. Small all-reduces go as an all-gather and
  // a local reduction (one round on two nodes, where libnbc's ring all-reduce takes two).
  bool sleep_only_beside_compute = false;
  bool Passive(size_t bytes) const {
    return max_sleep_us > 0 &&
           (sleep_only_beside_compute ||
            bytes >= static_cast<uint64_t>(std::max<int64_t>(0, passive_min_bytes)));
  }
};

class MpiCollective : public Collective {
 public:
  // `scaler` (optional, not owned) does AllReduceScaled's scaling pass with its vectorised,
  // threaded Scale; without it the pass is a plain loop. `policy` (MpiWaitPolicy) chooses per
  // call how AllReduce, AllReduceScaled, AllGather, AllToAll and AllGatherV wait: passively
  // (their non-blocking forms, completed by MPI_Test with sleeps in between instead of MPI's
  // busy polling, so a thread waiting on the wire or on a slower node leaves its core to the
  // threads and processes computing beside it; the sleeps grow with the wait, PassiveSleepUs:
  // 50 us at first, then 1/32 of the time waited so far, at most `max_sleep_us`) or inside MPI.
  // The other collectives block as usual.
  MpiCollective(MPI_Comm comm, Primitives* scaler, MpiWaitPolicy policy);
  // Every collective of the kinds above passive when `max_sleep_us` > 0, none when 0.
  explicit MpiCollective(MPI_Comm comm, Primitives* scaler = nullptr, int64_t max_sleep_us = 0)
      : MpiCollective(comm, scaler, MpiWaitPolicy{max_sleep_us, 0}) {}
  ~MpiCollective() override;

  // Changes the waiting (as the constructor's `policy`) for the calls after this one; every
  // rank must change it alike at the same point (blocking and non-blocking collectives do not
  // match).
  void set_policy(MpiWaitPolicy policy) { policy_ = policy; }
  void SetComputeProbe(const ComputeProbe* probe) override { probe_ = probe; }
  const MpiWaitPolicy& policy() const { return policy_; }

  // How many collectives of the kinds above waited each way since construction (AllGatherV's
  // size round and its gather count as two).
  uint64_t passive_waits() const { return passive_waits_; }
  uint64_t blocking_waits() const { return blocking_waits_; }

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
  // MPI_Alltoall straight between the caller's buffers (no copies, no size round).
  absl::Status AllToAll(const void* send, size_t block_bytes, void* recv) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;

 private:
  // Completes `req` (passive wait), started by a call that returned `started`: that code
  // checked, then MPI_Test, a short spin, then sleeps of PassiveSleepUs.
  absl::Status Finish(int started, MPI_Request* req, const char* what);
  // The policy's choice for a collective whose receive buffer holds `bytes`, counted.
  bool Passive(size_t bytes);
  // A small all-reduce as an all-gather of every rank's vector and a local reduction in rank
  // order (alike on every rank), non-blocking; false when it does not apply.
  bool SmallAllReduce(void* data, size_t count, ElemType type, ReduceOp op, absl::Status* status);

  MPI_Comm comm_;
  Primitives* scaler_ = nullptr;
  MpiWaitPolicy policy_;
  const ComputeProbe* probe_ = nullptr;
  uint64_t passive_waits_ = 0, blocking_waits_ = 0;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> counts_, displs_;            // scratch for the v-collectives
  std::vector<int> send_counts_, send_displs_;  // scratch for AllToAllV's send side
  std::vector<uint8_t> send_buf_, recv_buf_;    // AllToAllV's contiguous blocks
  std::vector<uint8_t> small_;                  // SmallAllReduce's gathered vectors
};

// Call before MPI_Init. Open MPI (4.x, coll/libnbc) runs MPI_Iallreduce on fewer than 4 ranks,
// or in place, as a binomial reduce followed by a broadcast: each half moves the whole buffer
// one way, so it takes twice a ring's time on a full-duplex link (measured: 17.0 s against
// 8.7 s for MPI_Allreduce of 25,557,032 floats on 2 hosts at 100 Mbit/s). This selects its
// ring algorithm (OMPI_MCA_coll_libnbc_iallreduce_algorithm=1) unless the environment already
// chose one; other MPI implementations ignore the variable.
void PreferRingIallreduce();

// The sleep between two MPI_Tests of a passive wait that has lasted `waited_us`: 50 us, or
// 1/32 of the wait so far once that is longer, at most `max_sleep_us` (a sleep never adds more
// than about 3% to a wait, and a wait of seconds on a slow link tests a few hundred times a
// second instead of 20,000). `max_sleep_us` <= 50: always 50 us.
int64_t PassiveSleepUs(int64_t waited_us, int64_t max_sleep_us);

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
