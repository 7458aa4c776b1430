// A node's sparse contribution to one exchange, as it travels between daemons
// (docs/algorithms.md#wire): a fixed 48-byte header, then the index section, then `count`
// values (float32, float16 when kChunkFp16 is set, bfloat16 when kChunkBf16 is; never both;
// none when kChunkIndexOnly is). Little-endian. The index section is either
//   - `count` uint32 indices (flag kChunkDeltaIdx clear), or
//   - with kChunkDeltaIdx: a uint32 L, then L bytes of unsigned LEB128 varints (7 bits a byte,
//     low group first, at most 5 bytes, minimal: no trailing 0x00 group byte), one per entry: the
//     first index as is, then idx[j] - idx[j-1] - 1 (so only strictly ascending sets can be
//     written), then zero bytes up to a multiple of 4 (the values stay 4-byte aligned within
//     the chunk). A chunk's length is thus 48 + 4 + round_up(L, 4) + count x value bytes;
//     ChunkLength reads it from the bytes.
// Encoders write the delta form when asked (IndexEncoding::kDelta: the engine passes spexd's
// --wire_index_encoding, delta by default; the functions' own default is uint32), the indices
// are strictly ascending and it is smaller; else uint32. Every chunk says its form in its flags,
// so receivers need no agreement.
// DecodeChunk validates everything against the bucket before anything is written: a bad peer
// is an error, never an out-of-bounds write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/base/no_init.h"
#include "kernels/half.h"

namespace spex {

inline constexpr uint32_t kChunkMagic = 0x43585053;  // "SPXC"
inline constexpr uint16_t kChunkVersion = 1;
inline constexpr uint16_t kChunkFp16 = 1;
inline constexpr uint16_t kChunkIndexOnly = 2;  // pattern A: indices, no value section
inline constexpr uint16_t kChunkBf16 = 4;       // values as bfloat16 (a bfloat16 bucket's)
inline constexpr uint16_t kChunkDeltaIdx = 8;   // index section: length + varint gaps (above)

// How encoders write the index section (spexd --wire_index_encoding).
enum class IndexEncoding {
  kU32,    // always `count` uint32 indices
  kDelta,  // varint gaps where the indices are strictly ascending and that is smaller
};
bool AbslParseFlag(absl::string_view text, IndexEncoding* out, std::string* error);
std::string AbslUnparseFlag(IndexEncoding v);

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

// The length of a chunk with uint32 indices (kChunkDeltaIdx clear).
size_t ChunkBytes(uint32_t count, bool fp16, bool index_only = false);

// The length the chunk at `data` claims, from its header and (kChunkDeltaIdx) its section's
// length word: how a reader finds where one chunk of a concatenation ends. `avail` is what may
// be read at `data`; when the header or the length word is not all there it returns more than
// `avail` (48 or 52). Nothing is validated here: DecodeChunk / DecodeIndexChunk do that.
size_t ChunkLength(const uint8_t* data, size_t avail);

// The bytes of the index section that EncodeChunk / EncodeIndexChunk would write for `idx`
// (4 x size with uint32 indices; 4 + round_up(L, 4) in the delta form), so stand-ins and cost
// figures can count the real wire bytes without building the chunk.
size_t IndexSectionBytes(absl::Span<const uint32_t> idx, IndexEncoding enc);

// Appends one encoded chunk to `out`.
void EncodeChunk(uint64_t group_id, uint64_t step, uint32_t elements,
                 absl::Span<const uint32_t> idx, absl::Span<const float> val, bool fp16,
                 const float scalars[4], std::vector<uint8_t>* out,
                 IndexEncoding enc = IndexEncoding::kU32);
// The same with the values as `wire` (kernels/half.h: float32, bfloat16 or float16, rounded to
// nearest even), or as float32 where one would not fit `wire` (ValuesWire, below): a value is
// never narrowed into an infinity. The bool form is wire = fp16 ? float16 : float32.
void EncodeChunk(uint64_t group_id, uint64_t step, uint32_t elements,
                 absl::Span<const uint32_t> idx, absl::Span<const float> val, DType wire,
                 const float scalars[4], std::vector<uint8_t>* out,
                 IndexEncoding enc = IndexEncoding::kU32);

// The type a node's values go out as when `wire` is asked for: `wire` itself, unless some value
// would round to +-Inf in it (a float16 value past 65504, a bfloat16 one past its range): then
// float32, for the whole chunk. Every chunk says its type in its flags, so receivers need no
// agreement; a value is never narrowed into an infinity it was not (docs/dtypes.md).
DType ValuesWire(DType wire, absl::Span<const float> val);

// Appends one index-only chunk (flags = kChunkIndexOnly, plus kChunkDeltaIdx in the delta form:
// the header and `idx`, no values).
void EncodeIndexChunk(uint64_t group_id, uint64_t step, uint32_t elements,
                      absl::Span<const uint32_t> idx, const float scalars[4],
                      std::vector<uint8_t>* out, IndexEncoding enc = IndexEncoding::kU32);

// A decoded view; indices point into the chunk (uint32 form) or idx_copy, values are converted
// when half.
struct DecodedChunk {
  DecodedChunk() = default;
  DecodedChunk(DecodedChunk&&) = default;
  DecodedChunk& operator=(DecodedChunk&&) = default;
  DecodedChunk(const DecodedChunk&) = delete;
  DecodedChunk& operator=(const DecodedChunk&) = delete;

  ChunkHeader header;
  // Points into the received bytes when they are 4-byte aligned, else into `idx_copy` (a chunk
  // after an fp16 one in a gathered buffer starts 2 bytes off) or the chunk's indices are in the
  // delta form (decoded there); hence move-only. Not cleared when sized: the decoder writes all
  // of it.
  const uint32_t* idx = nullptr;
  NoInitVector<uint32_t> idx_copy;
  std::vector<float> values;
  size_t bytes = 0;  // the chunk's length on the wire
};

// Checks magic, version, flags, group, step, bucket size, byte length and every index < elements;
// in the delta form also every varint (complete, at most 5 bytes, minimal, below 2^32), that
// the count's varints take exactly the section's length, the padding is zero and nothing
// follows. A chunk with the index-only flag is refused here.
absl::StatusOr<DecodedChunk> DecodeChunk(const uint8_t* data, size_t bytes, uint64_t group_id,
                                         uint64_t step, uint32_t elements, int peer);
// The same checks for an index-only chunk (the flag is required; `values` stays empty).
absl::StatusOr<DecodedChunk> DecodeIndexChunk(const uint8_t* data, size_t bytes, uint64_t group_id,
                                              uint64_t step, uint32_t elements, int peer);

}  // namespace spex
