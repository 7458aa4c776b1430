// The buckets of one node: creation (the shared segment with the header and, on the CPU path,
// the data; on the device path the data in the allocator's buffer; the accumulator; the
// compressor on the bucket's own primitives), lookup, removal and unlinking the segments once
// every local trainer has attached. Not thread-safe: the engine calls it under its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/engine/bucket.h"
#include "daemon/engine/engine_options.h"
#include "daemon/memory/device_memory.h"
#include "daemon/transport/collective.h"

namespace spex {

struct BucketSpec {
  uint64_t id = 0;
  uint64_t elements = 0;
  std::string compressor;
  double density = 0;
  std::map<std::string, std::string> params;  // the compressor's
  BucketPolicy policy;                        // the bucket's engine options
};

class BucketTable {
 public:
  // Everything is owned by the caller and outlives the table.
  BucketTable(const EngineOptions* options, Collective* coll, Primitives* prims, DevicePath device);

  // A new bucket with its memory and compressor (errors name the bucket).
  absl::StatusOr<EngineBucket*> Create(const BucketSpec& spec);
  // The memory a bucket of `elements` takes on this node (see EngineOptions' limits) and the
  // part of it in /dev/shm.
  uint64_t Footprint(uint64_t elements, bool sparse) const;
  // Whether a bucket of this compressor and size gets a compressor (else it exchanges dense;
  // a compressor whose pattern is dense turns out dense too, once built).
  bool SparseCandidate(const std::string& compressor, uint64_t elements) const;
  uint64_t ShmBytes(uint64_t elements) const;
  // Several GPUs: the buffer a local trainer's bucket of `elements` values of `dtype` takes on
  // GPU `device` when that is not the home GPU (DeviceBucketBytes(elements, 1)), else 0; and
  // what local trainer `slot`'s buffer of `b` takes there now (0 when it has none).
  uint64_t RemoteBytes(uint64_t elements, DType dtype, int device) const;
  uint64_t SlotRemoteBytes(const EngineBucket& b, uint32_t slot) const;
  // Every bucket's footprint, with its trainers' buffers on the other GPUs: the --max_*_bytes
  // limits count memory on every GPU of --devices.
  uint64_t TotalBytes() const;
  EngineBucket* Find(uint64_t id);
  void Erase(uint64_t id);
  void Clear() { buckets_.clear(); }
  bool empty() const { return buckets_.empty(); }
  size_t size() const { return buckets_.size(); }
  // In id order.
  const std::map<uint64_t, std::unique_ptr<EngineBucket>>& all() const { return buckets_; }

  // Several GPUs: the GPU `device` (-1: the home GPU) a local trainer says its bucket lives on,
  // checked against the path's GPUs: FailedPrecondition naming --devices for another.
  absl::Status CheckDevice(int device) const;
  // Puts local trainer `slot`'s buffer of `b` on GPU `device` (checked): a buffer of its own
  // there (DeviceBucketBytes(elements, 1), local_trainers + 1 events) unless it is the home GPU.
  // Only while trainer `slot` is not registered and no exchange of `b` runs.
  absl::Status PlaceSlot(EngineBucket* b, uint32_t slot, int device);
  // Zero-copy input (CPU path): local trainer `slot`'s input is `own` (its own memory, of the
  // bucket's size) from now on, or its slot in the segment again for null. Only while trainer
  // `slot` is not registered and no exchange of `b` runs.
  void PlaceOwnInput(EngineBucket* b, uint32_t slot, std::unique_ptr<TrainerMemory> own);

  // Unlinks the segments of buckets every local trainer has attached.
  void UnlinkAttached();
  std::vector<std::string> LinkedSegments() const;

 private:
  absl::Status AllocateHost(EngineBucket* b);
  absl::Status AllocateDevice(EngineBucket* b);
  absl::Status BuildCompressor(EngineBucket* b, double density);

  const EngineOptions* const options_;
  Collective* const coll_;
  Primitives* const prims_;
  const DevicePath device_;
  std::map<uint64_t, std::unique_ptr<EngineBucket>> buckets_;
};

}  // namespace spex
