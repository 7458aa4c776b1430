// libFuzzer target: the trainer's reader of a bucket's shared header (ResolveBucketView in
// client/client.h): the RegisterBucket reply's layout and the BucketHeader it points at are
// both untrusted here (a daemon of another version, a corrupted segment). The host segment is
// a heap block of exactly the mapped size, so any read or pointer outside it is caught by
// AddressSanitizer; device replies go through the CUDA IPC descriptor decoder and an
// IpcHandleCache over a fake opener whose "device memory" is a heap block of the described
// size. An accepted view must lie inside its buffers.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "client/client.h"
#include "proto/contract/layout.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

// Opens a "device" buffer as a host allocation of the size the cache asks for (bounded).
class FakeOpener : public spex::IpcOpener {
 public:
  absl::StatusOr<void*> OpenMemory(const spex::IpcHandle& handle, int device) override {
    return static_cast<void*>(new uint8_t[1]);  // never dereferenced by the reader
  }
  void CloseMemory(void* base, int device) override { delete[] static_cast<uint8_t*>(base); }
  absl::StatusOr<void*> OpenEvent(const spex::IpcHandle& handle, int device) override {
    return static_cast<void*>(new int(0));
  }
  void CloseEvent(void* event, int device) override { delete static_cast<int*>(event); }
};

uint64_t Offset(FuzzedDataProvider& in, uint64_t good) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      return good;
    case 1:
      return good + in.ConsumeIntegralInRange<int64_t>(-64, 64);
    case 2:
      return in.ConsumeIntegralInRange<uint64_t>(0, 1 << 16);
    default:
      return in.ConsumeIntegral<uint64_t>();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  spex::v1::RegisterBucketResponse resp;
  const uint32_t local_size = in.ConsumeIntegralInRange<uint32_t>(0, spex::kMaxLocalTrainers + 1);
  const uint32_t local_rank = in.ConsumeIntegralInRange<uint32_t>(0, spex::kMaxLocalTrainers + 1);
  size_t elements = in.ConsumeBool() ? in.ConsumeIntegralInRange<size_t>(0, 3000)
                                     : in.ConsumeIntegral<uint64_t>();
  const bool want_device = in.ConsumeBool();
  const bool reply_device = in.ConsumeBool() ? want_device : !want_device;
  // The host segment: header page plus slots, of a size near the right one.
  const uint32_t slots = local_size;
  const uint64_t good_bytes = elements <= 3000 ? spex::BucketBytes(elements, slots) : 8192;
  size_t host_size = in.ConsumeBool() ? good_bytes : in.ConsumeIntegralInRange<size_t>(0, 3 * 4096);
  if (host_size > (1u << 24)) host_size = 1u << 24;
  std::unique_ptr<uint8_t[]> host(new uint8_t[host_size ? host_size : 1]);
  std::memset(host.get(), 0, host_size);
  auto* layout = resp.mutable_layout();
  layout->set_header_offset(Offset(in, 0));
  layout->set_elements(in.ConsumeBool() ? elements : in.ConsumeIntegral<uint64_t>());
  if (host_size >= sizeof(spex::BucketHeader)) {
    spex::BucketHeader h;
    std::memset(static_cast<void*>(&h), 0, sizeof(h));
    h.magic = in.ConsumeBool() ? spex::kBucketMagic : in.ConsumeIntegral<uint32_t>();
    h.version = spex::kLayoutVersion;
    h.elements = in.ConsumeBool() ? elements : in.ConsumeIntegral<uint64_t>();
    h.slots = in.ConsumeBool() ? slots : in.ConsumeIntegral<uint32_t>();
    h.slot_stride = spex::SlotStride(elements);
    const uint64_t at = layout->header_offset();
    if (at <= host_size - sizeof(h)) std::memcpy(host.get() + at, &h, sizeof(h));
  }
  if (!reply_device) {
    layout->set_input_offset(
        Offset(in, elements <= 3000 ? spex::InputOffset(elements, local_rank) : 0));
    layout->set_output_offset(
        Offset(in, elements <= 3000 ? spex::OutputOffset(elements, slots) : 0));
  } else {
    layout->set_input_offset(0);
    layout->set_output_offset(0);
    auto* ipc = resp.mutable_device_buffer()->mutable_cuda_ipc();
    std::string handle(spex::kCudaIpcHandleBytes, '\0');
    handle[0] = static_cast<char>(in.ConsumeIntegralInRange<int>(0, 3));  // 0: all zeros
    ipc->set_mem_handle(in.ConsumeBool() ? handle : in.ConsumeRandomLengthString(80));
    const int events = in.ConsumeIntegralInRange<int>(0, spex::kMaxIpcEvents + 1);
    for (int e = 0; e < events; ++e) {
      std::string ev(spex::kCudaIpcHandleBytes, static_cast<char>(e + 1));
      ipc->add_event_handles(
          in.ConsumeIntegralInRange<int>(0, 15) ? ev : in.ConsumeRandomLengthString(80));
    }
    const uint64_t good_dev = elements <= 3000 ? spex::DeviceBucketBytes(elements, slots) : 4096;
    ipc->set_size(in.ConsumeBool() ? good_dev : in.ConsumeIntegral<uint64_t>());
    ipc->set_device_ordinal(in.ConsumeIntegralInRange<int32_t>(-1, 2));
    auto* dl = resp.mutable_device_layout();
    dl->set_elements(in.ConsumeBool() ? elements : in.ConsumeIntegral<uint64_t>());
    dl->set_input_offset(
        Offset(in, elements <= 3000 ? spex::DeviceInputOffset(elements, local_rank) : 0));
    dl->set_output_offset(
        Offset(in, elements <= 3000 ? spex::DeviceOutputOffset(elements, slots) : 0));
  }
  // Or a reply parsed from the remaining bytes as they came off the wire.
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    const std::string wire = in.ConsumeRemainingBytesAsString();
    if (!resp.ParseFromString(wire)) return 0;
  }
  spex::IpcHandleCache cache(std::make_unique<FakeOpener>());
  const bool with_cache = in.ConsumeIntegralInRange<int>(0, 7) != 0;
  auto view = spex::ResolveBucketView(resp, elements, local_rank, local_size, host.get(), host_size,
                                      want_device, with_cache ? &cache : nullptr);
  if (!view.ok()) return 0;
  const uint8_t* base = host.get();
  const uint64_t bytes = static_cast<uint64_t>(elements) * sizeof(float);
  const auto* hp = reinterpret_cast<const uint8_t*>(view->header);
  Check(hp >= base && hp + sizeof(spex::BucketHeader) <= base + host_size);
  Check(view->header->magic == spex::kBucketMagic && view->header->elements == elements);
  if (view->device == nullptr) {
    Check(!want_device);
    const auto* ip = reinterpret_cast<const uint8_t*>(view->input);
    const auto* op = reinterpret_cast<const uint8_t*>(view->output);
    Check(ip >= base && ip - base <= host_size && bytes <= host_size - (ip - base));
    Check(op >= base && op - base <= host_size && bytes <= host_size - (op - base));
    // Touch both ends of the slots: ASan reports a slot reaching past the segment.
    if (bytes) {
      volatile uint8_t x = ip[0] + ip[bytes - 1] + op[0] + op[bytes - 1];
      (void)x;
    }
  } else {
    Check(want_device);
    const auto* db = static_cast<const uint8_t*>(view->device->base);
    const auto* ip = reinterpret_cast<const uint8_t*>(view->input);
    const auto* op = reinterpret_cast<const uint8_t*>(view->output);
    const uint64_t dsize = view->device->size;
    Check(ip >= db && ip - db <= dsize && bytes <= dsize - (ip - db));
    Check(op >= db && op - db <= dsize && bytes <= dsize - (op - db));
    Check(local_rank < local_size && view->device->events.size() == local_size + 1);
  }
  return 0;
}
