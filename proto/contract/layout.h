// Byte layout of the shared segments that trainers map: the node doorbell and a bucket's
// buffer. This is a wire contract with every client (C++ and Python), so offsets are fixed and
// checked below; change only by bumping kLayoutVersion.
//
// Hot path protocol, per bucket and step s (all counters are little-endian, lock-free):
//  trainer r: write input slot r; store ready_ns[r] = CLOCK_MONOTONIC now (optional: 0 = not
//             stamped; the merger's timings use it, docs/merging.md 2.6); store ready[r] = s + 1
//             (release); increment doorbell.ring and
//             FUTEX_WAKE it when doorbell.engine_sleeping != 0;
//             then wait until published == (uint32)(s + 1): spin up to spin_us, then set
//             waiters += 1, FUTEX_WAIT on published, waiters -= 1.
//  daemon:    when ready[r] == s + 1 for every local trainer r, reduce, exchange, write output,
//             store status (0 = ok), then published = (uint32)(s + 1) (release) and FUTEX_WAKE
//             when waiters != 0. On error status != 0 and the trainer asks the Exchange RPC
//             for (bucket, s), which returns the error message.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace spex {

inline constexpr uint32_t kLayoutVersion = 1;
inline constexpr uint32_t kDoorbellMagic = 0x42585053;  // "SPXB" little-endian
inline constexpr uint32_t kBucketMagic = 0x4b585053;    // "SPXK"
inline constexpr uint32_t kMaxLocalTrainers = 32;
inline constexpr size_t kPageBytes = 4096;

// One per node and trainer generation; 4096 bytes.
struct DoorbellSegment {
  uint32_t magic;
  uint32_t version;
  alignas(64) std::atomic<uint32_t> ring;  // offset 64: futex word the engine waits on
  std::atomic<uint32_t> engine_sleeping;   // offset 68: 1 while the engine sleeps
  std::atomic<uint32_t> shutdown;          // offset 72: 1 once the daemon is stopping
  alignas(64) std::atomic<uint32_t> attached[kMaxLocalTrainers];  // offset 128: set by trainer r
};

// Head of every bucket buffer; 4096 bytes. Input slot r starts at
// kPageBytes + r * slot_stride, the output at kPageBytes + slots * slot_stride.
struct BucketHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t bucket_id;  // offset 8
  uint64_t elements;   // offset 16
  uint32_t slots;      // offset 24: local trainers
  // offset 28: the data type of the slots and the output (kernels/half.h DType: 0 float32,
  // 1 bfloat16, 2 float16; an addition of layout version 1: the field was reserved and 0).
  uint32_t dtype;
  uint64_t slot_stride;  // offset 32: bytes between input slots (multiple of 4096)
  alignas(64) std::atomic<uint32_t> published;  // offset 64: futex word, (uint32)(last step + 1)
  std::atomic<uint32_t> waiters;                // offset 68: trainers sleeping on published
  std::atomic<int32_t> status;                  // offset 72: 0 ok, else error (see Exchange RPC)
  alignas(64) std::atomic<uint32_t> attached[kMaxLocalTrainers];  // offset 128
  // offset 256: ready[r] = step + 1 once trainer r's input for that step is written;
  // each on its own 64-byte line so trainers do not share a line. ready_ns (offset 8 in the
  // line): the trainer's CLOCK_MONOTONIC nanoseconds when it wrote that input, stored before
  // `value`; 0 from a client that does not stamp (an addition of layout version 1: the field
  // was padding, so older clients leave it 0).
  struct alignas(64) Ready {
    std::atomic<uint64_t> value;
    std::atomic<uint64_t> ready_ns;
  } ready[kMaxLocalTrainers];
};

static_assert(sizeof(std::atomic<uint32_t>) == 4 && sizeof(std::atomic<uint64_t>) == 8);
static_assert(offsetof(DoorbellSegment, ring) == 64);
static_assert(offsetof(DoorbellSegment, engine_sleeping) == 68);
static_assert(offsetof(DoorbellSegment, shutdown) == 72);
static_assert(offsetof(DoorbellSegment, attached) == 128);
static_assert(sizeof(DoorbellSegment) <= kPageBytes);
static_assert(offsetof(BucketHeader, bucket_id) == 8);
static_assert(offsetof(BucketHeader, elements) == 16);
static_assert(offsetof(BucketHeader, slots) == 24);
static_assert(offsetof(BucketHeader, dtype) == 28);
static_assert(offsetof(BucketHeader, slot_stride) == 32);
static_assert(offsetof(BucketHeader, published) == 64);
static_assert(offsetof(BucketHeader, waiters) == 68);
static_assert(offsetof(BucketHeader, status) == 72);
static_assert(offsetof(BucketHeader, attached) == 128);
static_assert(offsetof(BucketHeader, ready) == 256);
using BucketReadyLine = BucketHeader::Ready;
static_assert(offsetof(BucketReadyLine, ready_ns) == 8);
static_assert(sizeof(BucketReadyLine) == 64);
static_assert(sizeof(BucketHeader) <= kPageBytes);

// `elem_bytes`: 4 for float32, 2 for bfloat16 and float16 buckets.
inline size_t SlotStride(uint64_t elements, size_t elem_bytes = sizeof(float)) {
  size_t bytes = elements * elem_bytes;
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}
inline size_t InputOffset(uint64_t elements, uint32_t slot, size_t elem_bytes = sizeof(float)) {
  return kPageBytes + slot * SlotStride(elements, elem_bytes);
}
inline size_t OutputOffset(uint64_t elements, uint32_t slots, size_t elem_bytes = sizeof(float)) {
  return kPageBytes + slots * SlotStride(elements, elem_bytes);
}
inline size_t BucketBytes(uint64_t elements, uint32_t slots, size_t elem_bytes = sizeof(float)) {
  return kPageBytes + (slots + 1) * SlotStride(elements, elem_bytes);
}

// A device bucket's data (the device path keeps the BucketHeader alone in a host shm page):
// input slot r at r * SlotStride(elements, elem_bytes) of the device buffer, the output after
// the last slot (see spex.proto RegisterBucketResponse.device_buffer); a half bucket's slots
// and output are 2 bytes an element, as on the host path.
inline size_t DeviceInputOffset(uint64_t elements, uint32_t slot,
                                size_t elem_bytes = sizeof(float)) {
  return slot * SlotStride(elements, elem_bytes);
}
inline size_t DeviceOutputOffset(uint64_t elements, uint32_t slots,
                                 size_t elem_bytes = sizeof(float)) {
  return slots * SlotStride(elements, elem_bytes);
}
inline size_t DeviceBucketBytes(uint64_t elements, uint32_t slots,
                                size_t elem_bytes = sizeof(float)) {
  return (slots + 1) * SlotStride(elements, elem_bytes);
}

}  // namespace spex
