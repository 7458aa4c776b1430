// CUDA IPC buffers (daemon/memory/cuda_ipc_buffer.h) without a GPU: descriptor encode/decode and
// its validation, the trainer-side handle cache with a fake opener (opened once, reused,
// stale descriptors refused, partial opens undone), and the real calls reporting why they
// cannot run here.
#include "daemon/memory/cuda_ipc_buffer.h"

#include <map>
#include <string>

#include "client/ipc_handle_cache.h"
#include "gtest/gtest.h"
#include "proto/spex.pb.h"

#ifdef SPEX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace spex {
namespace {

IpcHandle Handle(uint8_t fill) {
  IpcHandle h;
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint8_t>(fill + i);
  return h;
}

CudaIpcHandles Sample(uint8_t fill, int events) {
  CudaIpcHandles h;
  h.memory = Handle(fill);
  for (int e = 0; e < events; ++e) h.events.push_back(Handle(static_cast<uint8_t>(100 + e)));
  h.size = 3 << 20;
  h.device = 1;
  return h;
}

v1::BufferDescriptor Describe(const CudaIpcHandles& h) {
  v1::BufferDescriptor d;
  EncodeCudaIpcDescriptor(h, d.mutable_cuda_ipc());
  return d;
}

TEST(CudaIpcDescriptor, RoundTrip) {
  const CudaIpcHandles h = Sample(1, 3);
  v1::BufferDescriptor d = Describe(h);
  // Through the wire format too, as a trainer receives it.
  v1::BufferDescriptor parsed;
  ASSERT_TRUE(parsed.ParseFromString(d.SerializeAsString()));
  ASSERT_TRUE(parsed.has_cuda_ipc());
  EXPECT_EQ(parsed.cuda_ipc().mem_handle().size(), kCudaIpcHandleBytes);
  absl::StatusOr<CudaIpcHandles> back = DecodeCudaIpcDescriptor(parsed.cuda_ipc());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->memory, h.memory);
  EXPECT_EQ(back->events, h.events);
  EXPECT_EQ(back->size, h.size);
  EXPECT_EQ(back->device, h.device);
}

void ExpectInvalid(const v1::CudaIpcDescriptor& d, const std::string& mentions) {
  absl::StatusOr<CudaIpcHandles> h = DecodeCudaIpcDescriptor(d);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << mentions;
  EXPECT_NE(h.status().message().find(mentions), std::string::npos) << h.status();
}

TEST(CudaIpcDescriptor, ValidationNamesTheBadField) {
  const v1::CudaIpcDescriptor good = Describe(Sample(1, 2)).cuda_ipc();
  v1::CudaIpcDescriptor d = good;
  d.set_mem_handle("short");
  ExpectInvalid(d, "mem_handle has 5 bytes");
  d = good;
  d.set_mem_handle(std::string(kCudaIpcHandleBytes, '\0'));
  ExpectInvalid(d, "all zeros");
  d = good;
  d.set_event_handles(1, std::string(65, 'x'));
  ExpectInvalid(d, "event_handles[1] has 65 bytes");
  d = good;
  d.clear_event_handles();
  ExpectInvalid(d, "0 event handles");
  d = good;
  for (size_t i = 0; i < kMaxIpcEvents; ++i) d.add_event_handles(std::string(64, 'e'));
  ExpectInvalid(d, "event handles");
  d = good;
  d.set_size(0);
  ExpectInvalid(d, "size is 0");
  d = good;
  d.set_device_ordinal(-1);
  ExpectInvalid(d, "device_ordinal -1");
  EXPECT_TRUE(DecodeCudaIpcDescriptor(good).ok());
}

// Records every open and close; can fail the n-th event open.
class FakeOpener : public IpcOpener {
 public:
  struct Log {
    int memory_opens = 0, memory_closes = 0, event_opens = 0, event_closes = 0;
    std::map<void*, bool> live;
  };
  explicit FakeOpener(Log* log) : log_(log) {}
  absl::StatusOr<void*> OpenMemory(const IpcHandle& h, int device) override {
    ++log_->memory_opens;
    void* p = reinterpret_cast<void*>(0x1000 * (++next_));
    log_->live[p] = true;
    return p;
  }
  void CloseMemory(void* base, int) override {
    ++log_->memory_closes;
    EXPECT_TRUE(log_->live.erase(base)) << "closed something never opened";
  }
  absl::StatusOr<void*> OpenEvent(const IpcHandle&, int) override {
    if (fail_event_at >= 0 && log_->event_opens == fail_event_at) {
      ++log_->event_opens;
      return absl::FailedPreconditionError("fake: event open failed");
    }
    ++log_->event_opens;
    void* p = reinterpret_cast<void*>(0x1000 * (++next_) + 8);
    log_->live[p] = true;
    return p;
  }
  void CloseEvent(void* event, int) override {
    ++log_->event_closes;
    EXPECT_TRUE(log_->live.erase(event)) << "closed an event never opened";
  }
  int fail_event_at = -1;

 private:
  Log* log_;
  uintptr_t next_ = 0;
};

TEST(IpcHandleCache, OpensOncePerBufferAndReuses) {
  FakeOpener::Log log;
  {
    IpcHandleCache cache(std::make_unique<FakeOpener>(&log));
    const v1::BufferDescriptor a = Describe(Sample(1, 3)), b = Describe(Sample(2, 2));
    absl::StatusOr<const IpcMapping*> first = cache.Attach(a);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ((*first)->size, uint64_t{3} << 20);
    EXPECT_EQ((*first)->device, 1);
    EXPECT_EQ((*first)->events.size(), 3u);
    for (int step = 0; step < 100; ++step) {
      absl::StatusOr<const IpcMapping*> again = cache.Attach(a);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(*again, *first);
    }
    EXPECT_EQ(log.memory_opens, 1);
    EXPECT_EQ(log.event_opens, 3);
    ASSERT_TRUE(cache.Attach(b).ok());
    EXPECT_EQ(cache.open_count(), 2u);
    EXPECT_EQ(log.memory_opens, 2);

    ASSERT_TRUE(cache.Release(b).ok());
    EXPECT_EQ(cache.open_count(), 1u);
    EXPECT_EQ(log.memory_closes, 1);
    EXPECT_EQ(log.event_closes, 2);
    EXPECT_EQ(cache.Release(b).code(), absl::StatusCode::kNotFound);
  }
  // The destructor closed the rest.
  EXPECT_EQ(log.memory_closes, 2);
  EXPECT_EQ(log.event_closes, 5);
  EXPECT_TRUE(log.live.empty());
}

TEST(IpcHandleCache, StaleDescriptorForAnOpenHandleIsRefused) {
  FakeOpener::Log log;
  IpcHandleCache cache(std::make_unique<FakeOpener>(&log));
  CudaIpcHandles h = Sample(1, 2);
  ASSERT_TRUE(cache.Attach(Describe(h)).ok());
  h.size += 4096;
  absl::StatusOr<const IpcMapping*> stale = cache.Attach(Describe(h));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.status().message().find("stale"), std::string::npos) << stale.status();
  EXPECT_EQ(log.memory_opens, 1);
}

TEST(IpcHandleCache, FailedEventOpenUndoesTheWholeAttach) {
  FakeOpener::Log log;
  auto opener = std::make_unique<FakeOpener>(&log);
  opener->fail_event_at = 1;
  IpcHandleCache cache(std::move(opener));
  absl::StatusOr<const IpcMapping*> m = cache.Attach(Describe(Sample(1, 3)));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache.open_count(), 0u);
  EXPECT_EQ(log.memory_closes, 1);
  EXPECT_EQ(log.event_closes, 1);
  EXPECT_TRUE(log.live.empty());
}

TEST(IpcHandleCache, RejectsOtherDescriptorKindsAndBadHandles) {
  FakeOpener::Log log;
  IpcHandleCache cache(std::make_unique<FakeOpener>(&log));
  v1::BufferDescriptor shm;
  shm.mutable_shm()->set_name("/spex-x");
  EXPECT_EQ(cache.Attach(shm).status().code(), absl::StatusCode::kInvalidArgument);
  v1::BufferDescriptor bad = Describe(Sample(1, 1));
  bad.mutable_cuda_ipc()->set_mem_handle("x");
  EXPECT_EQ(cache.Attach(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log.memory_opens, 0);
}

bool GpuPresent() {
#ifdef SPEX_HAVE_CUDA
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return ok;
#else
  return false;
#endif
}

TEST(CudaIpcBuffer, ArgumentsAreCheckedFirst) {
  EXPECT_EQ(CudaIpcBuffer::Create(0, 2, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaIpcBuffer::Create(4096, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaIpcBuffer::Create(4096, kMaxIpcEvents + 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaIpcBuffer::Create(4096, 2, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaIpcBuffer, CreateOnThisMachine) {
  absl::StatusOr<std::unique_ptr<CudaIpcBuffer>> b = CudaIpcBuffer::Create(1 << 20, 3, 0);
  if (!GpuPresent()) {
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
#ifdef SPEX_HAVE_CUDA
    EXPECT_NE(b.status().message().find("cudaError"), std::string::npos) << b.status();
#else
    EXPECT_NE(b.status().message().find("built without CUDA"), std::string::npos) << b.status();
#endif
    // The trainer side says the same.
    IpcHandleCache cache(MakeCudaIpcOpener());
    EXPECT_EQ(cache.Attach(Describe(Sample(1, 1))).status().code(),
              absl::StatusCode::kFailedPrecondition);
    return;
  }
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE((*b)->on_device());
  EXPECT_NE((*b)->data(), nullptr);
  v1::BufferDescriptor d;
  (*b)->Describe(&d);
  absl::StatusOr<CudaIpcHandles> h = DecodeCudaIpcDescriptor(d.cuda_ipc());
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->events.size(), 3u);
  EXPECT_EQ(h->size, 1u << 20);
  EXPECT_TRUE((*b)->RecordSlot(2, nullptr).ok());
  EXPECT_TRUE((*b)->WaitSlot(2, nullptr).ok());
  EXPECT_EQ((*b)->RecordSlot(3, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*b)->Unlink().ok());
}

}  // namespace
}  // namespace spex
