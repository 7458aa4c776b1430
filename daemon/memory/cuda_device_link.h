// The CUDA implementation of the link between a node's GPUs (device_memory.h DeviceLink,
// docs/design.md#multi-gpu): at creation it enables peer access between every pair of the
// given GPUs that has it (cudaDeviceCanAccessPeer, cudaDeviceEnablePeerAccess); a copy between
// two such GPUs is one cudaMemcpyPeerAsync on a stream of the destination GPU, and between two
// without it goes in chunks through two pinned host buffers (device-to-host on a stream of the
// source GPU, host-to-device on one of the destination, an event per chunk so that chunk i's
// upload overlaps chunk i+1's download). Every copy is complete on return. Without
// --config=cuda, Create fails with "built without CUDA".
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/memory/device_memory.h"

namespace spex {

class CudaDeviceLink : public DeviceLink {
 public:
  // Between GPUs `ordinals` (distinct); `staging_bytes` per pinned buffer (two are made).
  static absl::StatusOr<std::unique_ptr<CudaDeviceLink>> Create(const std::vector<int>& ordinals,
                                                                size_t staging_bytes = 8 << 20);
  // A line for the log: which pairs have peer access.
  virtual std::string Describe() const = 0;
};

}  // namespace spex
