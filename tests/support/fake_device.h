// A fake device for the engine's device path, where no GPU exists: everything the engine and
// the trainers see of a device, with host memory behind it, plus the checks a real device would
// make by crashing or corrupting data.
//  - FakeAllocator: bucket buffers and scratch in host memory that say on_device() == true,
//    whose descriptors are cuda_ipc descriptors with fake handles (the memory handle carries
//    the buffer's address, so FakeIpcOpener can "open" it in the same process);
//  - FakeDevicePrimitives: the CPU primitives claiming Device::kCuda, so the engine cannot tell,
//    checking that every pointer they get is fake device memory (their AllocScratch returns
//    fake device memory);
//  - CheckedHostPrimitives: the CPU primitives, checking that no pointer is fake device memory;
//  - the slot ordering as a recorder;
//  - CheckedCollective: any Collective, checking that the dense all-reduce gets device memory
//    and that nothing else does (the host-staged traffic).
// One FakeDevice per simulated node. Everything is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/ipc_handle_cache.h"
#include "daemon/memory/device_memory.h"
#include "daemon/transport/collective.h"
#include "kernels/primitives.h"

namespace spex {
namespace fake {

class FakeDevice;

// A bucket buffer of the fake device.
class FakeBuffer final : public SharedBuffer {
 public:
  FakeBuffer(FakeDevice* device, uint64_t id, size_t bytes, int events);
  ~FakeBuffer() override;
  void* data() override { return base_; }
  size_t size() const override { return bytes_; }
  bool on_device() const override { return true; }
  void Describe(v1::BufferDescriptor* out) const override;
  absl::Status Unlink() override;

  uint64_t id() const { return id_; }
  int events() const { return events_; }
  bool unlinked() const;

 private:
  FakeDevice* const device_;
  const uint64_t id_;
  const size_t bytes_;
  const int events_;
  void* base_;
  mutable absl::Mutex mu_;
  bool unlinked_ ABSL_GUARDED_BY(mu_) = false;
};

// What the fake ordering and primitives saw, in order: "wait b<id> <slot>", "record b<id>
// <slot>", "touch b<id>" (a device primitive read or wrote the buffer).
struct Event {
  enum Kind { kWait, kRecord, kTouch } kind;
  uint64_t buffer = 0;
  int slot = -1;
  std::string ToString() const;
};

// Host-to-device and device-to-host staging traffic through the device primitives.
struct Staging {
  uint64_t to_host_calls = 0, to_host_bytes = 0;
  uint64_t from_host_calls = 0, from_host_bytes = 0;
  uint64_t to_host_max_bytes = 0;  // the largest single device-to-host copy
  // Device-to-host bytes into host staging from AllocHostStaging (pinned on a real GPU).
  uint64_t to_pinned_bytes = 0;
  // How many copies of each size there were, per direction.
  std::map<uint64_t, uint64_t> to_host_sizes, from_host_sizes;
};

class FakeDevice : public BufferAllocator, public SlotOrdering {
 public:
  explicit FakeDevice(int ordinal = 0, int cpu_threads = 1);
  ~FakeDevice() override;

  // The engine's device path: this allocator and ordering, plus checked host primitives.
  DevicePath path();
  // The primitives for the engine's bucket data (device memory).
  Primitives* device_prims() { return device_prims_.get(); }
  Primitives* host_prims() { return host_prims_.get(); }

  // BufferAllocator
  Device device() const override { return Device::kCuda; }
  absl::StatusOr<std::unique_ptr<SharedBuffer>> AllocateBucket(size_t bytes, int events) override;
  absl::StatusOr<std::unique_ptr<DeviceArray>> AllocateScratch(size_t bytes) override;
  // SlotOrdering (a recorder)
  absl::Status WaitInput(SharedBuffer* bucket, int slot) override;
  absl::Status RecordOutput(SharedBuffer* bucket, int slot) override;

  // Test controls: allocations fail with this status while it is not OK; WaitInput fails
  // when `fail_wait` returns true for (buffer, slot); `on_record` runs inside RecordOutput.
  void FailAllocations(absl::Status s);
  void SetWaitFailure(std::function<bool(const FakeBuffer&, int slot)> fail_wait);
  void SetOnRecord(std::function<void(FakeBuffer&, int slot)> on_record);

  // Whether [p, p + bytes) lies inside one live allocation of this device.
  bool IsDeviceMemory(const void* p, size_t bytes) const;
  // Records a misuse (a host pointer given to device primitives, or the reverse).
  void Violation(const std::string& what);
  // Logs a touch of the buffer holding `p` (nothing for scratch memory).
  void Touch(const void* p);

  std::vector<Event> events() const;
  std::vector<std::string> violations() const;
  Staging staging() const;
  void CountStaging(bool to_host, size_t bytes);
  // Host staging the device primitives allocated (AllocHostStaging): a real GPU's pinned memory.
  void RegisterPinned(const void* p, size_t bytes);
  void UnregisterPinned(const void* p);
  bool IsPinned(const void* p, size_t bytes) const;
  void CountPinned(size_t bytes);
  int ordinal() const { return ordinal_; }
  int live_buffers() const;
  // Memory of this device (buffer: the FakeBuffer it belongs to, null for scratch).
  void Register(const void* p, size_t bytes, FakeBuffer* buffer);
  void Unregister(const void* p);

 private:
  friend class FakeBuffer;
  struct Range {
    const uint8_t* begin;
    size_t bytes;
    FakeBuffer* buffer;  // null for scratch
  };
  const int ordinal_;
  std::unique_ptr<Primitives> device_prims_, host_prims_;
  mutable absl::Mutex mu_;
  std::vector<Range> ranges_ ABSL_GUARDED_BY(mu_);
  std::vector<Range> pinned_ ABSL_GUARDED_BY(mu_);
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
  Staging staging_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status fail_allocations_ ABSL_GUARDED_BY(mu_);
  std::function<bool(const FakeBuffer&, int)> fail_wait_ ABSL_GUARDED_BY(mu_);
  std::function<void(FakeBuffer&, int)> on_record_ ABSL_GUARDED_BY(mu_);
};

// Wraps a Collective: AllReduceScaled must get `device` memory, every other call host memory
// (it is the engine's control and sparse traffic, staged through host memory).
std::unique_ptr<Collective> CheckedCollective(std::unique_ptr<Collective> inner,
                                              FakeDevice* device);

// A trainer's IpcOpener for FakeBuffer descriptors (in the same process): OpenMemory returns
// the buffer's address; events are opened as distinct tokens and every RecordEvent/WaitEvent
// is logged as "record <event>" / "wait <event>".
class FakeIpcOpener final : public IpcOpener {
 public:
  struct Log {
    absl::Mutex mu;
    int memory_opens ABSL_GUARDED_BY(mu) = 0;
    std::vector<std::string> calls ABSL_GUARDED_BY(mu);
  };
  explicit FakeIpcOpener(Log* log) : log_(log) {}
  absl::StatusOr<void*> OpenMemory(const IpcHandle& handle, int device) override;
  void CloseMemory(void*, int) override {}
  absl::StatusOr<void*> OpenEvent(const IpcHandle& handle, int device) override;
  void CloseEvent(void*, int) override {}
  absl::Status RecordEvent(void* event, void* stream, int device) override;
  absl::Status WaitEvent(void* event, void* stream, int device) override;

 private:
  Log* log_;
};

}  // namespace fake
}  // namespace spex
