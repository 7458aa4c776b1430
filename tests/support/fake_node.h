// Several fake GPUs on one node (docs/design.md#multi-gpu), for the engine's multi-GPU path
// where no GPU exists: one FakeDevice per ordinal (the first is the home GPU) and the link
// between them (DeviceLink), with or without peer access. A copy checks that its source and
// destination are memory of the GPUs it names; without peer access it goes through a host
// buffer and is counted as staging on both GPUs (FakeDevice::staging), as the CUDA link stages
// through pinned host memory. The home device's primitives already refuse memory of any other
// device, so a step that read a remote trainer's slot without the gather shows as a violation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/memory/device_memory.h"
#include "tests/support/fake_device.h"

namespace spex {
namespace fake {

class FakeNode final : public DeviceLink {
 public:
  // GPUs `ordinals` (the first is home), each a FakeDevice with `cpu_threads` threads.
  FakeNode(std::vector<int> ordinals, bool peer_access, int cpu_threads = 1);

  // The engine's device path: the home device's, plus the others and this link.
  DevicePath path();
  Primitives* device_prims() { return devices_.front()->device_prims(); }
  FakeDevice* home() { return devices_.front().get(); }
  FakeDevice* device(int ordinal);
  const std::vector<std::unique_ptr<FakeDevice>>& devices() const { return devices_; }

  // DeviceLink
  absl::Status Copy(int dst_device, void* dst, int src_device, const void* src,
                    size_t bytes) override;
  bool PeerAccess(int from, int to) const override;

  struct LinkStats {
    uint64_t peer_copies = 0, peer_bytes = 0;
    uint64_t staged_copies = 0, staged_bytes = 0;
  };
  LinkStats stats() const;
  // Every device's violations and the link's own (a copy with memory of the wrong device).
  std::vector<std::string> violations() const;

 private:
  const bool peer_;
  std::vector<std::unique_ptr<FakeDevice>> devices_;
  mutable absl::Mutex mu_;
  LinkStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fake
}  // namespace spex
