#include "tests/support/fake_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/spex.pb.h"

namespace spex {
namespace fake {
namespace {

constexpr char kMagic[8] = {'S', 'P', 'E', 'X', 'F', 'A', 'K', 'E'};
constexpr size_t kAlign = 64;

void* AllocZeroed(size_t bytes) {
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  std::memset(p, 0, rounded == 0 ? kAlign : rounded);
  return p;
}

class FakeArray final : public DeviceArray {
 public:
  FakeArray(FakeDevice* device, size_t bytes, void* p) : device_(device), bytes_(bytes), p_(p) {}
  ~FakeArray() override;
  void* data() override { return p_; }
  size_t size() const override { return bytes_; }

 private:
  FakeDevice* device_;
  size_t bytes_;
  void* p_;
};

// The device primitives' scratch: a FakeArray (device memory of the fake device).
class FakeScratch final : public ScratchBuffer {
 public:
  explicit FakeScratch(std::unique_ptr<DeviceArray> a)
      : ScratchBuffer(a->data(), a->size()), array_(std::move(a)) {}

 private:
  std::unique_ptr<DeviceArray> array_;
};

// The device primitives' host staging: host memory registered as the fake device's pinned
// memory while it lives.
class PinnedStaging final : public ScratchBuffer {
 public:
  PinnedStaging(FakeDevice* d, std::unique_ptr<ScratchBuffer> b)
      : ScratchBuffer(b->data(), b->bytes()), d_(d), b_(std::move(b)) {
    d_->RegisterPinned(data(), bytes());
  }
  ~PinnedStaging() override { d_->UnregisterPinned(data()); }

 private:
  FakeDevice* d_;
  std::unique_ptr<ScratchBuffer> b_;
};

// Primitives that check on which side of the fake device every pointer they get is, then
// forward to the CPU primitives. `device_side`: they stand for the device's primitives.
class CheckedPrimitives final : public Primitives {
 public:
  CheckedPrimitives(FakeDevice* device, bool device_side, int threads)
      : d_(device), device_side_(device_side), cpu_(MakeCpuPrimitives(threads)) {}

  Device device() const override { return device_side_ ? Device::kCuda : Device::kCpu; }

  void Accumulate(float* y, const float* x, size_t n) override {
    Mine(y, n * 4, "Accumulate y");
    Mine(x, n * 4, "Accumulate x");
    cpu_->Accumulate(y, x, n);
  }
  void Scale(float* x, float a, size_t n) override {
    Mine(x, n * 4, "Scale");
    cpu_->Scale(x, a, n);
  }
  absl::Status SumScaledCheckFinite(float* y, const float* const* xs, int count, float a, size_t n,
                                    size_t* first_bad) override {
    Mine(y, n * 4, "SumScaledCheckFinite y");
    for (int r = 0; r < count; ++r) Mine(xs[r], n * 4, "SumScaledCheckFinite x");
    return cpu_->SumScaledCheckFinite(y, xs, count, a, n, first_bad);
  }
  size_t CountAbove(const float* x, size_t n, float t) override {
    Mine(x, n * 4, "CountAbove");
    return cpu_->CountAbove(x, n, t);
  }
  size_t SelectAbove(float* x, size_t begin, size_t end, float t, bool zero, uint32_t* idx,
                     float* val, size_t capacity) override {
    Mine(x + begin, end > begin ? (end - begin) * 4 : 0, "SelectAbove x");
    Mine(idx, capacity * 4, "SelectAbove idx");
    Mine(val, capacity * 4, "SelectAbove val");
    return cpu_->SelectAbove(x, begin, end, t, zero, idx, val, capacity);
  }
  size_t AddSelectAbove(float* acc, const float* add, size_t begin, size_t end, float t, bool zero,
                        uint32_t* idx, float* val, size_t capacity) override {
    const size_t len = end > begin ? (end - begin) * 4 : 0;
    Mine(acc + begin, len, "AddSelectAbove acc");
    Mine(add + begin, len, "AddSelectAbove add");
    Mine(idx, capacity * 4, "AddSelectAbove idx");
    Mine(val, capacity * 4, "AddSelectAbove val");
    return cpu_->AddSelectAbove(acc, add, begin, end, t, zero, idx, val, capacity);
  }
  size_t TopK(const float* x, size_t n, size_t k, uint32_t* idx, float* val) override {
    Mine(x, n * 4, "TopK x");
    Mine(idx, std::min(n, k) * 4, "TopK idx");
    Mine(val, std::min(n, k) * 4, "TopK val");
    return cpu_->TopK(x, n, k, idx, val);
  }
  AbsMoments Moments(const float* x, size_t n, float lower_bound) override {
    Mine(x, n * 4, "Moments");
    return cpu_->Moments(x, n, lower_bound);
  }
  void Sample(const float* x, size_t n, size_t m, uint64_t seed, float* out) override {
    Mine(x, n * 4, "Sample x");
    Mine(out, m * 4, "Sample out");
    cpu_->Sample(x, n, m, seed, out);
  }
  absl::Status ScatterAdd(float* y, size_t n, const uint32_t* idx, const float* val,
                          size_t m) override {
    Mine(y, n * 4, "ScatterAdd y");
    Mine(idx, m * 4, "ScatterAdd idx");
    Mine(val, m * 4, "ScatterAdd val");
    return cpu_->ScatterAdd(y, n, idx, val, m);
  }
  absl::Status Gather(const float* x, size_t n, const uint32_t* idx, size_t m,
                      float* out) override {
    Mine(x, n * 4, "Gather x");
    Mine(idx, m * 4, "Gather idx");
    Mine(out, m * 4, "Gather out");
    return cpu_->Gather(x, n, idx, m, out);
  }
  absl::Status ZeroAt(float* x, size_t n, const uint32_t* idx, size_t m) override {
    Mine(x, n * 4, "ZeroAt x");
    Mine(idx, m * 4, "ZeroAt idx");
    return cpu_->ZeroAt(x, n, idx, m);
  }
  void AbsHistogram16(const float* x, size_t begin, size_t end, uint32_t* bins) override {
    Mine(x + begin, end > begin ? (end - begin) * 4 : 0, "AbsHistogram16 x");
    Mine(bins, kHistogramBins * 4, "AbsHistogram16 bins");
    cpu_->AbsHistogram16(x, begin, end, bins);
  }
  // The bins are counted and walked where the device keeps them (here: host memory standing for
  // it, by the CPU primitives' default walk); what a GPU reads back is the edge alone, so that
  // is what is counted as device-to-host staging.
  absl::StatusOr<HistogramEdge> AbsHistogramEdge(const float* x, size_t begin, size_t end,
                                                 uint32_t first_bin, uint64_t quota) override {
    Mine(x + begin, end > begin ? (end - begin) * 4 : 0, "AbsHistogramEdge x");
    if (device_side_) d_->CountStaging(true, sizeof(HistogramEdge));
    return cpu_->AbsHistogramEdge(x, begin, end, first_bin, quota);
  }
  // Host memory either way; the device side's is registered as pinned, so copies into it count.
  absl::StatusOr<std::unique_ptr<ScratchBuffer>> AllocHostStaging(size_t bytes) override {
    absl::StatusOr<std::unique_ptr<ScratchBuffer>> b = cpu_->AllocHostStaging(bytes);
    if (!b.ok() || !device_side_) return b;
    return std::unique_ptr<ScratchBuffer>(std::make_unique<PinnedStaging>(d_, std::move(*b)));
  }
  absl::Status Copy(float* dst, const float* src, size_t n) override {
    Mine(dst, n * 4, "Copy dst");
    Mine(src, n * 4, "Copy src");
    return cpu_->Copy(dst, src, n);
  }
  absl::Status Fill(float* x, float v, size_t n) override {
    Mine(x, n * 4, "Fill");
    return cpu_->Fill(x, v, n);
  }
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    Mine(src, bytes, "CopyToHost src");
    OnHost(host_dst, bytes, "CopyToHost dst");
    if (device_side_) d_->CountStaging(true, bytes);
    if (device_side_ && d_->IsPinned(host_dst, bytes)) d_->CountPinned(bytes);
    return cpu_->CopyToHost(host_dst, src, bytes);
  }
  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    Mine(dst, bytes, "CopyFromHost dst");
    OnHost(host_src, bytes, "CopyFromHost src");
    if (device_side_) d_->CountStaging(false, bytes);
    return cpu_->CopyFromHost(dst, host_src, bytes);
  }
  // The half passes: the CPU's (kernels/half.h), on this side's memory.
  absl::Status SumWidenHalf(DType t, float* y, const float* acc, const uint16_t* const* xs,
                            int count, float a, size_t n, size_t* first_bad) override {
    Mine(y, n * 4, "SumWidenHalf y");
    if (acc != nullptr) Mine(acc, n * 4, "SumWidenHalf acc");
    for (int r = 0; r < count; ++r) Mine(xs[r], n * 2, "SumWidenHalf x");
    return cpu_->SumWidenHalf(t, y, acc, xs, count, a, n, first_bad);
  }
  absl::Status NarrowHalf(DType t, const float* x, uint16_t* y, size_t n) override {
    Mine(x, n * 4, "NarrowHalf x");
    Mine(y, n * 2, "NarrowHalf y");
    return cpu_->NarrowHalf(t, x, y, n);
  }
  absl::Status WidenHalf(DType t, const uint16_t* x, float* y, size_t n) override {
    Mine(x, n * 2, "WidenHalf x");
    Mine(y, n * 4, "WidenHalf y");
    return cpu_->WidenHalf(t, x, y, n);
  }
  absl::StatusOr<std::unique_ptr<ScratchBuffer>> AllocScratch(size_t bytes) override {
    if (!device_side_) return cpu_->AllocScratch(bytes);
    absl::StatusOr<std::unique_ptr<DeviceArray>> a = d_->AllocateScratch(bytes);
    if (!a.ok()) return a.status();
    return std::unique_ptr<ScratchBuffer>(std::make_unique<FakeScratch>(std::move(*a)));
  }
  absl::Status Health() const override {
    std::vector<std::string> v = d_->violations();
    if (v.empty()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("fake device misuse: ", v.front()));
  }

 private:
  // `p` must be memory of this object's side.
  void Mine(const void* p, size_t bytes, const char* what) {
    if (device_side_) {
      OnDevice(p, bytes, what);
    } else {
      OnHost(p, bytes, what);
    }
  }
  void OnDevice(const void* p, size_t bytes, const char* what) {
    if (bytes == 0) return;
    if (!d_->IsDeviceMemory(p, bytes)) {
      d_->Violation(absl::StrCat(device_side_ ? "device" : "host", " primitives, ", what,
                                 ": host memory where device memory belongs"));
    }
    d_->Touch(p);
  }
  void OnHost(const void* p, size_t bytes, const char* what) {
    if (bytes == 0) return;
    if (d_->IsDeviceMemory(p, 1) ||
        d_->IsDeviceMemory(static_cast<const uint8_t*>(p) + bytes - 1, 1)) {
      d_->Violation(absl::StrCat(device_side_ ? "device" : "host", " primitives, ", what,
                                 ": device memory where host memory belongs"));
    }
  }

  FakeDevice* d_;
  const bool device_side_;
  std::unique_ptr<Primitives> cpu_;
};

class Checked final : public Collective {
 public:
  Checked(std::unique_ptr<Collective> inner, FakeDevice* d) : inner_(std::move(inner)), d_(d) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* name() const override { return "fake-nccl"; }
  absl::Status AllReduce(void* data, size_t count, ElemType type, ReduceOp op) override {
    Host(data, count * ElemSize(type), "AllReduce");
    return inner_->AllReduce(data, count, type, op);
  }
  absl::Status AllReduceScaled(const float* send, float* recv, size_t count, float scale) override {
    if (count > 0 &&
        (!d_->IsDeviceMemory(send, count * 4) || !d_->IsDeviceMemory(recv, count * 4))) {
      d_->Violation(
          "collective: AllReduceScaled on host memory (the dense path stays on the device)");
    }
    return inner_->AllReduceScaled(send, recv, count, scale);
  }
  absl::Status AllGather(const void* send, size_t bytes, void* recv) override {
    Host(send, bytes, "AllGather");
    return inner_->AllGather(send, bytes, recv);
  }
  absl::Status AllGatherV(const void* send, size_t send_bytes, std::vector<size_t>* counts,
                          std::vector<uint8_t>* recv) override {
    Host(send, send_bytes, "AllGatherV");
    return inner_->AllGatherV(send, send_bytes, counts, recv);
  }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    Host(data, bytes, "Broadcast");
    return inner_->Broadcast(data, bytes, root);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }

 private:
  void Host(const void* p, size_t bytes, const char* what) {
    if (bytes > 0 && d_->IsDeviceMemory(p, 1)) {
      d_->Violation(
          absl::StrCat("collective: ", what, " on device memory (expected host staging)"));
    }
  }
  std::unique_ptr<Collective> inner_;
  FakeDevice* d_;
};

}  // namespace

std::string Event::ToString() const {
  switch (kind) {
    case kWait:
      return absl::StrCat("wait b", buffer, " ", slot);
    case kRecord:
      return absl::StrCat("record b", buffer, " ", slot);
    case kTouch:
      return absl::StrCat("touch b", buffer);
  }
  return "?";
}

FakeBuffer::FakeBuffer(FakeDevice* device, uint64_t id, size_t bytes, int events)
    : device_(device), id_(id), bytes_(bytes), events_(events), base_(AllocZeroed(bytes)) {
  device_->Register(base_, bytes_, this);
}

FakeBuffer::~FakeBuffer() {
  device_->Unregister(base_);
  std::free(base_);
}

void FakeBuffer::Describe(v1::BufferDescriptor* out) const {
  CudaIpcHandles h;
  const uint64_t address = reinterpret_cast<uintptr_t>(base_);
  std::memcpy(h.memory.data(), kMagic, 8);
  std::memcpy(h.memory.data() + 8, &address, 8);
  std::memcpy(h.memory.data() + 16, &id_, 8);
  for (int e = 0; e < events_; ++e) {
    IpcHandle eh{};
    std::memcpy(eh.data(), kMagic, 8);
    std::memcpy(eh.data() + 8, &id_, 8);
    eh[16] = static_cast<uint8_t>(e);
    h.events.push_back(eh);
  }
  h.size = bytes_;
  h.device = device_->ordinal();
  EncodeCudaIpcDescriptor(h, out->mutable_cuda_ipc());
}

absl::Status FakeBuffer::Unlink() {
  absl::MutexLock lock(&mu_);
  unlinked_ = true;
  return absl::OkStatus();
}

bool FakeBuffer::unlinked() const {
  absl::MutexLock lock(&mu_);
  return unlinked_;
}

FakeArray::~FakeArray() {
  device_->Unregister(p_);
  std::free(p_);
}

FakeDevice::FakeDevice(int ordinal, int cpu_threads)
    : ordinal_(ordinal),
      device_prims_(std::make_unique<CheckedPrimitives>(this, true, cpu_threads)),
      host_prims_(std::make_unique<CheckedPrimitives>(this, false, cpu_threads)) {}

FakeDevice::~FakeDevice() = default;

DevicePath FakeDevice::path() {
  DevicePath p;
  p.allocator = this;
  p.ordering = this;
  p.host_prims = host_prims_.get();
  return p;
}

absl::StatusOr<std::unique_ptr<SharedBuffer>> FakeDevice::AllocateBucket(size_t bytes, int events) {
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (!fail_allocations_.ok()) return fail_allocations_;
    id = next_id_++;
  }
  return std::unique_ptr<SharedBuffer>(std::make_unique<FakeBuffer>(this, id, bytes, events));
}

absl::StatusOr<std::unique_ptr<DeviceArray>> FakeDevice::AllocateScratch(size_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    if (!fail_allocations_.ok()) return fail_allocations_;
  }
  void* p = AllocZeroed(bytes);
  Register(p, bytes, nullptr);
  return std::unique_ptr<DeviceArray>(std::make_unique<FakeArray>(this, bytes, p));
}

absl::Status FakeDevice::WaitInput(SharedBuffer* bucket, int slot) {
  auto* b = dynamic_cast<FakeBuffer*>(bucket);
  if (b == nullptr) {
    Violation("WaitInput on a buffer this device did not allocate");
    return absl::InternalError("WaitInput: not a fake device buffer");
  }
  std::function<bool(const FakeBuffer&, int)> fail;
  {
    absl::MutexLock lock(&mu_);
    events_.push_back({Event::kWait, b->id(), slot});
    fail = fail_wait_;
  }
  if (slot < 0 || slot >= b->events()) Violation(absl::StrCat("WaitInput: no event ", slot));
  if (fail && fail(*b, slot)) {
    return absl::InternalError(absl::StrCat("fake cudaStreamWaitEvent failure on event ", slot));
  }
  return absl::OkStatus();
}

absl::Status FakeDevice::RecordOutput(SharedBuffer* bucket, int slot) {
  auto* b = dynamic_cast<FakeBuffer*>(bucket);
  if (b == nullptr) {
    Violation("RecordOutput on a buffer this device did not allocate");
    return absl::InternalError("RecordOutput: not a fake device buffer");
  }
  std::function<void(FakeBuffer&, int)> on_record;
  {
    absl::MutexLock lock(&mu_);
    events_.push_back({Event::kRecord, b->id(), slot});
    on_record = on_record_;
  }
  if (slot < 0 || slot >= b->events()) Violation(absl::StrCat("RecordOutput: no event ", slot));
  if (on_record) on_record(*b, slot);
  return absl::OkStatus();
}

void FakeDevice::FailAllocations(absl::Status s) {
  absl::MutexLock lock(&mu_);
  fail_allocations_ = std::move(s);
}

void FakeDevice::SetWaitFailure(std::function<bool(const FakeBuffer&, int)> fail_wait) {
  absl::MutexLock lock(&mu_);
  fail_wait_ = std::move(fail_wait);
}

void FakeDevice::SetOnRecord(std::function<void(FakeBuffer&, int)> on_record) {
  absl::MutexLock lock(&mu_);
  on_record_ = std::move(on_record);
}

bool FakeDevice::IsDeviceMemory(const void* p, size_t bytes) const {
  const auto* q = static_cast<const uint8_t*>(p);
  absl::MutexLock lock(&mu_);
  for (const Range& r : ranges_) {
    if (q >= r.begin && q + bytes <= r.begin + r.bytes) return true;
  }
  return false;
}

void FakeDevice::Violation(const std::string& what) {
  absl::MutexLock lock(&mu_);
  violations_.push_back(what);
}

void FakeDevice::Touch(const void* p) {
  const auto* q = static_cast<const uint8_t*>(p);
  absl::MutexLock lock(&mu_);
  for (const Range& r : ranges_) {
    if (r.buffer == nullptr || q < r.begin || q >= r.begin + r.bytes) continue;
    const Event e{Event::kTouch, r.buffer->id(), -1};
    if (events_.empty() || events_.back().kind != Event::kTouch ||
        events_.back().buffer != e.buffer) {
      events_.push_back(e);
    }
    return;
  }
}

std::vector<Event> FakeDevice::events() const {
  absl::MutexLock lock(&mu_);
  return events_;
}

std::vector<std::string> FakeDevice::violations() const {
  absl::MutexLock lock(&mu_);
  return violations_;
}

Staging FakeDevice::staging() const {
  absl::MutexLock lock(&mu_);
  return staging_;
}

void FakeDevice::CountStaging(bool to_host, size_t bytes) {
  absl::MutexLock lock(&mu_);
  if (to_host) {
    staging_.to_host_calls++;
    staging_.to_host_bytes += bytes;
    staging_.to_host_max_bytes = std::max<uint64_t>(staging_.to_host_max_bytes, bytes);
    staging_.to_host_sizes[bytes]++;
  } else {
    staging_.from_host_calls++;
    staging_.from_host_bytes += bytes;
    staging_.from_host_sizes[bytes]++;
  }
}

void FakeDevice::CountPinned(size_t bytes) {
  absl::MutexLock lock(&mu_);
  staging_.to_pinned_bytes += bytes;
}

void FakeDevice::RegisterPinned(const void* p, size_t bytes) {
  absl::MutexLock lock(&mu_);
  pinned_.push_back({static_cast<const uint8_t*>(p), bytes, nullptr});
}

void FakeDevice::UnregisterPinned(const void* p) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < pinned_.size(); ++i) {
    if (pinned_[i].begin == p) {
      pinned_.erase(pinned_.begin() + i);
      return;
    }
  }
}

bool FakeDevice::IsPinned(const void* p, size_t bytes) const {
  const auto* q = static_cast<const uint8_t*>(p);
  absl::MutexLock lock(&mu_);
  for (const Range& r : pinned_) {
    if (q >= r.begin && q + bytes <= r.begin + r.bytes) return true;
  }
  return false;
}

int FakeDevice::live_buffers() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const Range& r : ranges_) n += r.buffer != nullptr;
  return n;
}

void FakeDevice::Register(const void* p, size_t bytes, FakeBuffer* buffer) {
  absl::MutexLock lock(&mu_);
  ranges_.push_back({static_cast<const uint8_t*>(p), bytes, buffer});
}

void FakeDevice::Unregister(const void* p) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < ranges_.size(); ++i) {
    if (ranges_[i].begin == p) {
      ranges_.erase(ranges_.begin() + i);
      return;
    }
  }
}

std::unique_ptr<Collective> CheckedCollective(std::unique_ptr<Collective> inner,
                                              FakeDevice* device) {
  return std::make_unique<Checked>(std::move(inner), device);
}

absl::StatusOr<void*> FakeIpcOpener::OpenMemory(const IpcHandle& handle, int) {
  if (std::memcmp(handle.data(), kMagic, 8) != 0) {
    return absl::InvalidArgumentError("FakeIpcOpener: not a fake device memory handle");
  }
  uint64_t address;
  std::memcpy(&address, handle.data() + 8, 8);
  absl::MutexLock lock(&log_->mu);
  log_->memory_opens++;
  return reinterpret_cast<void*>(static_cast<uintptr_t>(address));
}

absl::StatusOr<void*> FakeIpcOpener::OpenEvent(const IpcHandle& handle, int) {
  if (std::memcmp(handle.data(), kMagic, 8) != 0) {
    return absl::InvalidArgumentError("FakeIpcOpener: not a fake event handle");
  }
  // A token naming the event: (buffer id << 8) | index, plus one so it is never null.
  uint64_t id;
  std::memcpy(&id, handle.data() + 8, 8);
  return reinterpret_cast<void*>(static_cast<uintptr_t>((id << 8 | handle[16]) + 1));
}

absl::Status FakeIpcOpener::RecordEvent(void* event, void*, int) {
  absl::MutexLock lock(&log_->mu);
  log_->calls.push_back(absl::StrCat("record ", (reinterpret_cast<uintptr_t>(event) - 1) & 0xff));
  return absl::OkStatus();
}

absl::Status FakeIpcOpener::WaitEvent(void* event, void*, int) {
  absl::MutexLock lock(&log_->mu);
  log_->calls.push_back(absl::StrCat("wait ", (reinterpret_cast<uintptr_t>(event) - 1) & 0xff));
  return absl::OkStatus();
}

}  // namespace fake
}  // namespace spex
