// The C++ client's device-bucket logic (client/client.h) without a GPU: a RegisterBucket reply
// carrying a host shm header plus a CUDA IPC data buffer is resolved through the IpcHandleCache
// with a fake opener whose "device memory" is host memory (so pointers can be checked), opened
// once and reused; mismatches between what the client asked for and what the daemon described
// are refused; the stream ordering records this trainer's input event and waits for the output
// event. Also the real opener here: "built without CUDA" or the CUDA runtime's error.
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/ipc_handle_cache.h"
#include "gtest/gtest.h"
#include "proto/spex.pb.h"

namespace spex {
namespace {

// Device memory stands in as host vectors; events are fake addresses; every ordering call is
// logged.
class FakeOpener : public IpcOpener {
 public:
  struct Log {
    int memory_opens = 0, event_opens = 0;
    std::vector<std::string> calls;  // "record <event index> <stream>", "wait ..."
  };
  FakeOpener(Log* log, std::vector<float>* memory) : log_(log), memory_(memory) {}
  absl::StatusOr<void*> OpenMemory(const IpcHandle&, int) override {
    ++log_->memory_opens;
    return static_cast<void*>(memory_->data());
  }
  void CloseMemory(void*, int) override {}
  absl::StatusOr<void*> OpenEvent(const IpcHandle& h, int) override {
    ++log_->event_opens;
    return reinterpret_cast<void*>(uintptr_t{0x1000} + h[0]);  // event i: handle byte 0 = i
  }
  void CloseEvent(void*, int) override {}
  absl::Status RecordEvent(void* event, void* stream, int) override {
    log_->calls.push_back(Name("record", event, stream));
    return absl::OkStatus();
  }
  absl::Status WaitEvent(void* event, void* stream, int) override {
    log_->calls.push_back(Name("wait", event, stream));
    return absl::OkStatus();
  }

 private:
  static std::string Name(const char* what, void* event, void* stream) {
    return std::string(what) + " " + std::to_string(reinterpret_cast<uintptr_t>(event) - 0x1000) +
           " " + std::to_string(reinterpret_cast<uintptr_t>(stream));
  }
  Log* log_;
  std::vector<float>* memory_;
};

constexpr uint32_t kTrainers = 2;
constexpr size_t kElements = 3000;

// A host header page as the daemon writes it.
struct HostSegment {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(BucketBytes(kElements, kTrainers), 0);
  HostSegment() {
    auto* h = new (bytes.data()) BucketHeader();
    h->magic = kBucketMagic;
    h->version = kLayoutVersion;
    h->bucket_id = 7;
    h->elements = kElements;
    h->slots = kTrainers;
    h->slot_stride = SlotStride(kElements);
  }
};

v1::RegisterBucketResponse HostReply(uint32_t rank) {
  v1::RegisterBucketResponse r;
  r.mutable_buffer()->mutable_shm()->set_name("/spex-test");
  r.mutable_buffer()->mutable_shm()->set_size(BucketBytes(kElements, kTrainers));
  r.mutable_layout()->set_header_offset(0);
  r.mutable_layout()->set_input_offset(InputOffset(kElements, rank));
  r.mutable_layout()->set_output_offset(OutputOffset(kElements, kTrainers));
  r.mutable_layout()->set_elements(kElements);
  return r;
}

v1::RegisterBucketResponse DeviceReply(uint32_t rank, int events = kTrainers + 1) {
  v1::RegisterBucketResponse r;
  r.mutable_buffer()->mutable_shm()->set_name("/spex-test");
  r.mutable_buffer()->mutable_shm()->set_size(kPageBytes);
  r.mutable_layout()->set_header_offset(0);
  r.mutable_layout()->set_elements(kElements);
  CudaIpcHandles h;
  for (size_t i = 0; i < h.memory.size(); ++i) h.memory[i] = static_cast<uint8_t>(i + 1);
  for (int e = 0; e < events; ++e) {
    IpcHandle eh{};
    eh[0] = static_cast<uint8_t>(e);
    eh[1] = 0xee;
    h.events.push_back(eh);
  }
  h.size = DeviceBucketBytes(kElements, kTrainers);
  h.device = 3;
  EncodeCudaIpcDescriptor(h, r.mutable_device_buffer()->mutable_cuda_ipc());
  r.mutable_device_layout()->set_input_offset(DeviceInputOffset(kElements, rank));
  r.mutable_device_layout()->set_output_offset(DeviceOutputOffset(kElements, kTrainers));
  r.mutable_device_layout()->set_elements(kElements);
  return r;
}

struct Fixture {
  FakeOpener::Log log;
  std::vector<float> device_memory =
      std::vector<float>(DeviceBucketBytes(kElements, kTrainers) / 4);
  IpcHandleCache cache{std::make_unique<FakeOpener>(&log, &device_memory)};
  HostSegment host;
};

TEST(ClientDeviceBuckets, HostReplyResolvesIntoTheShmSegment) {
  HostSegment host;
  absl::StatusOr<BucketView> v =
      ResolveBucketView(HostReply(1), kElements, 1, kTrainers, host.bytes.data(), host.bytes.size(),
                        /*want_device=*/false, nullptr);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->device, nullptr);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(v->input), host.bytes.data() + InputOffset(kElements, 1));
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(v->output),
            host.bytes.data() + OutputOffset(kElements, kTrainers));
  // Host buckets: the ordering helpers do nothing.
  EXPECT_TRUE(MarkDeviceInputWritten(nullptr, *v, 1, nullptr).ok());
  EXPECT_TRUE(AwaitDeviceOutput(nullptr, *v, kTrainers, nullptr).ok());
}

TEST(ClientDeviceBuckets, DeviceReplyResolvesIntoTheIpcBufferOpenedOnce) {
  Fixture f;
  for (uint32_t rank = 0; rank < kTrainers; ++rank) {
    // The header stays in host memory; input and output are in the (fake) device buffer.
    absl::StatusOr<BucketView> v =
        ResolveBucketView(DeviceReply(rank), kElements, rank, kTrainers, f.host.bytes.data(),
                          kPageBytes, /*want_device=*/true, &f.cache);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_NE(v->device, nullptr);
    EXPECT_EQ(v->device->device, 3);
    EXPECT_EQ(reinterpret_cast<uint8_t*>(v->header), f.host.bytes.data());
    const uint8_t* base = reinterpret_cast<const uint8_t*>(f.device_memory.data());
    EXPECT_EQ(reinterpret_cast<uint8_t*>(v->input), base + DeviceInputOffset(kElements, rank));
    EXPECT_EQ(reinterpret_cast<const uint8_t*>(v->output),
              base + DeviceOutputOffset(kElements, kTrainers));
  }
  // Same buffer, same process: opened once (memory and its 3 events), reused after.
  EXPECT_EQ(f.log.memory_opens, 1);
  EXPECT_EQ(f.log.event_opens, 3);
  EXPECT_EQ(f.cache.open_count(), 1u);
}

TEST(ClientDeviceBuckets, StreamOrderingUsesThisTrainersEventThenTheOutputs) {
  Fixture f;
  absl::StatusOr<BucketView> v = ResolveBucketView(DeviceReply(1), kElements, 1, kTrainers,
                                                   f.host.bytes.data(), kPageBytes, true, &f.cache);
  ASSERT_TRUE(v.ok()) << v.status();
  void* stream = reinterpret_cast<void*>(uintptr_t{42});
  ASSERT_TRUE(MarkDeviceInputWritten(&f.cache, *v, 1, stream).ok());
  ASSERT_TRUE(AwaitDeviceOutput(&f.cache, *v, kTrainers, stream).ok());
  EXPECT_EQ(f.log.calls, (std::vector<std::string>{"record 1 42", "wait 2 42"}));
}

TEST(ClientDeviceBuckets, MismatchedRepliesAreRefused) {
  Fixture f;
  // Asked for CUDA, got host; asked for host, got CUDA.
  absl::StatusOr<BucketView> v =
      ResolveBucketView(HostReply(0), kElements, 0, kTrainers, f.host.bytes.data(),
                        f.host.bytes.size(), true, &f.cache);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("--device=cuda"), std::string::npos) << v.status();
  v = ResolveBucketView(DeviceReply(0), kElements, 0, kTrainers, f.host.bytes.data(), kPageBytes,
                        false, nullptr);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  // Wrong number of IPC events (must be one per trainer plus the output).
  v = ResolveBucketView(DeviceReply(0, kTrainers), kElements, 0, kTrainers, f.host.bytes.data(),
                        kPageBytes, true, &f.cache);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(v.status().message().find("IPC events"), std::string::npos) << v.status();
  // A device layout past the buffer's end.
  v1::RegisterBucketResponse r = DeviceReply(0);
  r.mutable_device_layout()->set_output_offset(DeviceBucketBytes(kElements, kTrainers));
  f.cache.Release(r.device_buffer()).IgnoreError();
  v = ResolveBucketView(r, kElements, 0, kTrainers, f.host.bytes.data(), kPageBytes, true,
                        &f.cache);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInternal);
  // A header that is not a bucket header.
  HostSegment other;
  reinterpret_cast<BucketHeader*>(other.bytes.data())->magic = 0;
  v = ResolveBucketView(DeviceReply(0), kElements, 0, kTrainers, other.bytes.data(), kPageBytes,
                        true, &f.cache);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  // Host layout that does not fit the mapped size.
  v = ResolveBucketView(HostReply(1), kElements, 1, kTrainers, f.host.bytes.data(), kPageBytes,
                        false, nullptr);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInternal);
}

TEST(ClientDeviceBuckets, OrderingOutsideTheEventsIsRefused) {
  Fixture f;
  absl::StatusOr<BucketView> v = ResolveBucketView(DeviceReply(0), kElements, 0, kTrainers,
                                                   f.host.bytes.data(), kPageBytes, true, &f.cache);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(MarkDeviceInputWritten(&f.cache, *v, kTrainers + 1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(f.log.calls.empty());
}

TEST(ClientDeviceBuckets, RealOpenerHereSaysWhyItCannotOpen) {
  std::vector<float> unused;
  HostSegment host;
  IpcHandleCache cache(MakeCudaIpcOpener());
  absl::StatusOr<BucketView> v = ResolveBucketView(DeviceReply(0), kElements, 0, kTrainers,
                                                   host.bytes.data(), kPageBytes, true, &cache);
  // No GPU on this project's machines: built without CUDA, or the CUDA runtime's error. (On a
  // GPU machine the forged handle is refused by cudaIpcOpenMemHandle.)
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition) << v.status();
  EXPECT_NE(v.status().message().find("bucket 7"), std::string::npos) << v.status();
  EXPECT_NE(v.status().message().find("cudaIpcOpenMemHandle"), std::string::npos) << v.status();
}

}  // namespace
}  // namespace spex

// Half-precision host buckets (docs/dtypes.md): 2-byte slots, the header's dtype code checked.
namespace spex {
namespace {

TEST(ClientHalfBuckets, HalfReplyResolvesWithTwoByteSlotsAndAWrongTypeIsRefused) {
  std::vector<uint8_t> bytes(BucketBytes(kElements, kTrainers, 2), 0);
  auto* h = new (bytes.data()) BucketHeader();
  h->magic = kBucketMagic;
  h->version = kLayoutVersion;
  h->elements = kElements;
  h->slots = kTrainers;
  h->dtype = 1;  // bfloat16
  h->slot_stride = SlotStride(kElements, 2);
  v1::RegisterBucketResponse r = HostReply(1);
  r.mutable_buffer()->mutable_shm()->set_size(bytes.size());
  r.mutable_layout()->set_input_offset(InputOffset(kElements, 1, 2));
  r.mutable_layout()->set_output_offset(OutputOffset(kElements, kTrainers, 2));
  absl::StatusOr<BucketView> v = ResolveBucketView(r, kElements, 1, kTrainers, bytes.data(),
                                                   bytes.size(), false, nullptr, /*dtype=*/1);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(reinterpret_cast<uint8_t*>(v->input), bytes.data() + InputOffset(kElements, 1, 2));
  // A client that registered float16 (or float32) against a bfloat16 segment is refused.
  for (uint32_t other : {0u, 2u}) {
    absl::StatusOr<BucketView> bad = ResolveBucketView(r, kElements, 1, kTrainers, bytes.data(),
                                                       bytes.size(), false, nullptr, other);
    ASSERT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition) << other;
    EXPECT_NE(bad.status().message().find("data type code 1"), std::string::npos) << bad.status();
  }
  // The float32 bucket's offsets would run past this segment: refused, not mapped.
  r.mutable_layout()->set_output_offset(OutputOffset(kElements, kTrainers));
  EXPECT_FALSE(ResolveBucketView(r, kElements, 1, kTrainers, bytes.data(), bytes.size() / 2 + 1,
                                 false, nullptr, 1)
                   .ok());
}

}  // namespace
}  // namespace spex
