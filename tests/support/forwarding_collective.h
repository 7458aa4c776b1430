// A Collective that forwards every call to another one: the base of the tests' tampering,
// counting, failing and slowed collectives, which override only the calls they change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "daemon/transport/collective.h"

namespace spex::test {

class ForwardingCollective : public Collective {
 public:
  // Forwards to `inner`, which must outlive this one.
  explicit ForwardingCollective(Collective* inner) : inner_(inner) {}
  // Forwards to `inner` and owns it.
  explicit ForwardingCollective(std::unique_ptr<Collective> inner)
      : owned_(std::move(inner)), inner_(owned_.get()) {}
  Collective* inner() const { return inner_; }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* name() const override { return "forwarding"; }
  absl::Status AllReduce(void* data, size_t count, ElemType type, ReduceOp op) override {
    return inner_->AllReduce(data, count, type, op);
  }
  absl::Status AllReduceScaled(const float* send, float* recv, size_t count, float scale) override {
    return inner_->AllReduceScaled(send, recv, count, scale);
  }
  absl::Status AllGather(const void* send, size_t bytes, void* recv) override {
    return inner_->AllGather(send, bytes, recv);
  }
  absl::Status AllGatherV(const void* send, size_t send_bytes, std::vector<size_t>* counts,
                          std::vector<uint8_t>* recv) override {
    return inner_->AllGatherV(send, send_bytes, counts, recv);
  }
  // The inner collective's own all-to-all (not the default built on this one's AllGatherV).
  absl::Status AllToAllV(const std::vector<std::vector<uint8_t>>& send,
                         std::vector<std::vector<uint8_t>>* recv) override {
    return inner_->AllToAllV(send, recv);
  }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    return inner_->Broadcast(data, bytes, root);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }

 private:
  std::unique_ptr<Collective> owned_;
  Collective* inner_;
};

}  // namespace spex::test
