// A node's sparse contribution to one exchange, as it travels between daemons
// (docs/algorithms.md#wire): a fixed 48-byte header, then `count` uint32 indices,
// then `count` values (float32, float16 when kChunkFp16 is set, bfloat16 when kChunkBf16 is;
// never both). Little-endian.
// DecodeChunk validates everything against the bucket before anything is written: a bad peer
// is an error, never an out-of-bounds write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/half.h"

namespace spex {

inline constexpr uint32_t kChunkMagic = 0x43585053;  // "SPXC"
inline constexpr uint16_t kChunkVersion = 1;
inline constexpr uint16_t kChunkFp16 = 1;
inline constexpr uint16_t kChunkIndexOnly = 2;  // pattern A: indices, no value section
inline constexpr uint16_t kChunkBf16 = 4;       // values as bfloat16 (a bfloat16 bucket's)

struct ChunkHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t flags;
  uint64_t group_id;  // bucket id (or merge-group id)
  uint64_t step;
  uint32_t count;     // entries in this chunk
  uint32_t elements;  // size of the bucket the indices point into
  float scalars[4];   // compressor scalars (e.g. the threshold used); informational
};
static_assert(sizeof(ChunkHeader) == 48);

size_t ChunkBytes(uint32_t count, bool fp16, bool index_only = false);

// Appends one encoded chunk to `out`.
void EncodeChunk(uint64_t group_id, uint64_t step, uint32_t elements,
                 absl::Span<const uint32_t> idx, absl::Span<const float> val, bool fp16,
                 const float scalars[4], std::vector<uint8_t>* out);
// The same with the values as `wire` (kernels/half.h: float32, bfloat16 or float16, rounded to
// nearest even), or as float32 where one would not fit `wire` (ValuesWire, below): a value is
// never narrowed into an infinity. The bool form is wire = fp16 ? float16 : float32.
void EncodeChunk(uint64_t group_id, uint64_t step, uint32_t elements,
                 absl::Span<const uint32_t> idx, absl::Span<const float> val, DType wire,
                 const float scalars[4], std::vector<uint8_t>* out);

// The type a node's values go out as when `wire` is asked for: `wire` itself, unless some value
// would round to +-Inf in it (a float16 value past 65504, a bfloat16 one past its range): then
// float32, for the whole chunk. Every chunk says its type in its flags, so receivers need no
// agreement; a value is never narrowed into an infinity it was not (docs/dtypes.md).
DType ValuesWire(DType wire, absl::Span<const float> val);

// Appends one index-only chunk (flags = kChunkIndexOnly: the header and `idx`, no values).
void EncodeIndexChunk(uint64_t group_id, uint64_t step, uint32_t elements,
                      absl::Span<const uint32_t> idx, const float scalars[4],
                      std::vector<uint8_t>* out);

// A decoded view; indices point into the chunk, values are converted when fp16.
struct DecodedChunk {
  DecodedChunk() = default;
  DecodedChunk(DecodedChunk&&) = default;
  DecodedChunk& operator=(DecodedChunk&&) = default;
  DecodedChunk(const DecodedChunk&) = delete;
  DecodedChunk& operator=(const DecodedChunk&) = delete;

  ChunkHeader header;
  // Points into the received bytes when they are 4-byte aligned, else into `idx_copy` (a chunk
  // after an fp16 one in a gathered buffer starts 2 bytes off); hence move-only.
  const uint32_t* idx = nullptr;
  std::vector<uint32_t> idx_copy;
  std::vector<float> values;
};

// Checks magic, version, flags, group, step, bucket size, byte length and every index < elements.
// A chunk with the index-only flag is refused here.
absl::StatusOr<DecodedChunk> DecodeChunk(const uint8_t* data, size_t bytes, uint64_t group_id,
                                         uint64_t step, uint32_t elements, int peer);
// The same checks for an index-only chunk (the flag is required; `values` stays empty).
absl::StatusOr<DecodedChunk> DecodeIndexChunk(const uint8_t* data, size_t bytes, uint64_t group_id,
                                              uint64_t step, uint32_t elements, int peer);

}  // namespace spex
