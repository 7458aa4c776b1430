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
  std::map<std::string, std::string> params;
};

class BucketTable {
 public:
  // Everything is owned by the caller and outlives the table.
  BucketTable(const EngineOptions* options, Collective* coll, Primitives* prims, DevicePath device);

  // A new bucket with its memory and compressor (errors name the bucket).
  absl::StatusOr<Bucket*> Create(const BucketSpec& spec);
  Bucket* Find(uint64_t id);
  void Erase(uint64_t id);
  void Clear() { buckets_.clear(); }
  bool empty() const { return buckets_.empty(); }
  size_t size() const { return buckets_.size(); }
  // In id order.
  const std::map<uint64_t, std::unique_ptr<Bucket>>& all() const { return buckets_; }

  // Unlinks the segments of buckets every local trainer has attached.
  void UnlinkAttached();
  std::vector<std::string> LinkedSegments() const;

 private:
  absl::Status AllocateHost(Bucket* b);
  absl::Status AllocateDevice(Bucket* b);
  absl::Status BuildCompressor(Bucket* b, double density);

  const EngineOptions* const options_;
  Collective* const coll_;
  Primitives* const prims_;
  const DevicePath device_;
  std::map<uint64_t, std::unique_ptr<Bucket>> buckets_;
};

}  // namespace spex
