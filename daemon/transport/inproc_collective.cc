// InprocCollective (inproc_collective.h): threads of one process as nodes, so engine tests run
// several daemons without mpirun.
#include "daemon/transport/inproc_collective.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace spex {

class InProcessCollective : public Collective {
 public:
  InProcessCollective(InProcessHub* hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  const char* name() const override { return "inproc"; }

  absl::Status AllReduce(void* data, size_t count, ElemType type, ReduceOp op) override {
    const size_t bytes = count * ElemSize(type);
    std::vector<uint8_t> result(bytes);
    absl::Status s = Round(data, bytes, [&](const InProcessHub::Slot* slots) -> absl::Status {
      for (int r = 0; r < size(); ++r) {
        if (slots[r].bytes != bytes) return SizeMismatch("AllReduce", r, slots[r].bytes, bytes);
      }
      if (bytes) std::memcpy(result.data(), slots[0].data, bytes);  // count 0: no null to memcpy
      for (int r = 1; r < size(); ++r) Combine(result.data(), slots[r].data, count, type, op);
      return absl::OkStatus();
    });
    if (s.ok() && bytes) std::memcpy(data, result.data(), bytes);
    return s;
  }

  absl::Status AllReduceScaled(const float* send, float* recv, size_t count, float scale) override {
    std::vector<float> result(count);
    absl::Status s = Round(send, count * 4, [&](const InProcessHub::Slot* slots) -> absl::Status {
      for (int r = 0; r < size(); ++r) {
        if (slots[r].bytes != count * 4)
          return SizeMismatch("AllReduceScaled", r, slots[r].bytes, count * 4);
      }
      // Sum in rank order on every rank so all ranks get bit-identical results.
      for (int r = 0; r < size(); ++r) {
        const float* x = static_cast<const float*>(slots[r].data);
        for (size_t i = 0; i < count; ++i) result[i] += x[i];
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    for (size_t i = 0; i < count; ++i) recv[i] = result[i] * scale;
    return absl::OkStatus();
  }

  absl::Status AllGather(const void* send, size_t bytes, void* recv) override {
    return Round(send, bytes, [&](const InProcessHub::Slot* slots) -> absl::Status {
      for (int r = 0; r < size(); ++r) {
        if (slots[r].bytes != bytes) return SizeMismatch("AllGather", r, slots[r].bytes, bytes);
      }
      for (int r = 0; r < size(); ++r) {
        uint8_t* to = static_cast<uint8_t*>(recv) + r * bytes;
        // Gathered in place: this rank's block is there already (and the others read it now).
        if (bytes && to != slots[r].data) std::memcpy(to, slots[r].data, bytes);
      }
      return absl::OkStatus();
    });
  }

  absl::Status AllGatherV(const void* send, size_t send_bytes, std::vector<size_t>* counts,
                          std::vector<uint8_t>* recv) override {
    return Round(send, send_bytes, [&](const InProcessHub::Slot* slots) -> absl::Status {
      counts->assign(size(), 0);
      size_t total = 0;
      for (int r = 0; r < size(); ++r) total += (*counts)[r] = slots[r].bytes;
      recv->resize(total);
      size_t off = 0;
      for (int r = 0; r < size(); ++r) {
        if (slots[r].bytes) std::memcpy(recv->data() + off, slots[r].data, slots[r].bytes);
        off += slots[r].bytes;
      }
      return absl::OkStatus();
    });
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size())
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " out of range"));
    std::vector<uint8_t> copy(bytes);
    absl::Status s = Round(data, bytes, [&](const InProcessHub::Slot* slots) -> absl::Status {
      if (slots[root].bytes != bytes)
        return SizeMismatch("Broadcast", root, slots[root].bytes, bytes);
      if (bytes) std::memcpy(copy.data(), slots[root].data, bytes);
      return absl::OkStatus();
    });
    if (s.ok() && rank_ != root && bytes) std::memcpy(data, copy.data(), bytes);
    return s;
  }

  absl::Status Barrier() override {
    return Round(nullptr, 0, [](const InProcessHub::Slot*) { return absl::OkStatus(); });
  }

 private:
  template <typename Fn>
  absl::Status Round(const void* data, size_t bytes, Fn&& read) {
    absl::Status s = hub_->Arrive(rank_, data, bytes);
    if (!s.ok()) return s;
    absl::Status r = read(hub_->slots_.data());
    s = hub_->Depart(rank_);
    return r.ok() ? s : r;
  }

  static absl::Status SizeMismatch(const char* op, int peer, size_t got, size_t want) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": rank ", peer, " contributed ", got, " bytes, this rank ", want));
  }

  InProcessHub* hub_;
  int rank_;
};

InProcessHub::InProcessHub(int size, absl::Duration timeout)
    : size_(size), timeout_(timeout), slots_(size) {}

std::unique_ptr<Collective> InProcessHub::Connect(int rank) {
  return std::make_unique<InProcessCollective>(this, rank);
}

absl::Status InProcessHub::Wait(uint64_t* counter, uint64_t target) {
  absl::Time deadline = absl::Now() + timeout_;
  while (*counter < target) {
    if (cv_.WaitWithDeadline(&mu_, deadline) && *counter < target) {
      return absl::DeadlineExceededError(
          absl::StrCat("in-process collective: a peer rank did not arrive within ",
                       absl::FormatDuration(timeout_)));
    }
  }
  return absl::OkStatus();
}

absl::Status InProcessHub::Arrive(int rank, const void* data, size_t bytes) {
  absl::MutexLock lock(&mu_);
  // Round number of this arrival; a rank cannot start round k+1 before all left round k.
  const uint64_t round = arrived_ / size_;
  absl::Status s = Wait(&departed_, round * size_);
  if (!s.ok()) return s;
  slots_[rank] = Slot{data, bytes};
  ++arrived_;
  cv_.SignalAll();
  return Wait(&arrived_, (round + 1) * size_);
}

absl::Status InProcessHub::Depart(int rank) {
  absl::MutexLock lock(&mu_);
  const uint64_t round = departed_ / size_;
  ++departed_;
  cv_.SignalAll();
  return Wait(&departed_, (round + 1) * size_);
}

}  // namespace spex
