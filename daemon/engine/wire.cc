// Encoding and checked decoding of a node's sparse contribution as it travels between daemons
// (wire.h).
#include "daemon/engine/wire.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace spex {

namespace {

ChunkHeader MakeHeader(uint64_t group_id, uint64_t step, uint32_t elements, size_t count,
                       uint16_t flags, const float scalars[4]) {
  ChunkHeader h{};
  h.magic = kChunkMagic;
  h.version = kChunkVersion;
  h.flags = flags;
  h.group_id = group_id;
  h.step = step;
  h.count = static_cast<uint32_t>(count);
  h.elements = elements;
  if (scalars) std::memcpy(h.scalars, scalars, sizeof(h.scalars));
  return h;
}

}  // namespace

size_t ChunkBytes(uint32_t count, bool fp16, bool index_only) {
  return sizeof(ChunkHeader) + static_cast<size_t>(count) * (4 + (index_only ? 0 : fp16 ? 2 : 4));
}

void EncodeChunk(uint64_t group_id, uint64_t step, uint32_t elements,
                 absl::Span<const uint32_t> idx, absl::Span<const float> val, bool fp16,
                 const float scalars[4], std::vector<uint8_t>* out) {
  EncodeChunk(group_id, step, elements, idx, val, fp16 ? DType::kFloat16 : DType::kFloat32, scalars,
              out);
}

void EncodeChunk(uint64_t group_id, uint64_t step, uint32_t elements,
                 absl::Span<const uint32_t> idx, absl::Span<const float> val, DType wire,
                 const float scalars[4], std::vector<uint8_t>* out) {
  wire = ValuesWire(wire, val.first(std::min(val.size(), idx.size())));
  const uint16_t flag = wire == DType::kFloat16    ? kChunkFp16
                        : wire == DType::kBFloat16 ? kChunkBf16
                                                   : 0;
  const ChunkHeader h = MakeHeader(group_id, step, elements, idx.size(), flag, scalars);
  const size_t at = out->size();
  out->resize(at + ChunkBytes(h.count, IsHalf(wire)));
  uint8_t* p = out->data() + at;
  std::memcpy(p, &h, sizeof(h));
  p += sizeof(h);
  if (!idx.empty()) std::memcpy(p, idx.data(), idx.size() * 4);  // no null pointer to memcpy
  p += idx.size() * 4;
  // The chunk holds idx.size() values: a shorter `val` leaves zeros, a longer one is cut.
  const size_t nv = std::min(val.size(), idx.size());
  if (IsHalf(wire)) {
    for (size_t i = 0; i < nv; ++i) {
      const uint16_t v = FloatToHalf(wire, val[i]);  // kernels/half.h: RNE, NaN kept quiet
      std::memcpy(p + 2 * i, &v, 2);
    }
  } else {
    if (nv != 0) std::memcpy(p, val.data(), nv * 4);
  }
}

DType ValuesWire(DType wire, absl::Span<const float> val) {
  if (!IsHalf(wire)) return wire;
  for (float v : val) {
    if (!HalfFits(wire, v)) return DType::kFloat32;
  }
  return wire;
}

void EncodeIndexChunk(uint64_t group_id, uint64_t step, uint32_t elements,
                      absl::Span<const uint32_t> idx, const float scalars[4],
                      std::vector<uint8_t>* out) {
  const ChunkHeader h = MakeHeader(group_id, step, elements, idx.size(), kChunkIndexOnly, scalars);
  const size_t at = out->size();
  out->resize(at + ChunkBytes(h.count, false, true));
  std::memcpy(out->data() + at, &h, sizeof(h));
  if (!idx.empty()) std::memcpy(out->data() + at + sizeof(h), idx.data(), idx.size() * 4);
}

namespace {

absl::StatusOr<DecodedChunk> Decode(const uint8_t* data, size_t bytes, uint64_t group_id,
                                    uint64_t step, uint32_t elements, int peer, bool index_only) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("malformed sparse chunk from node ", peer,
                                            " for bucket ", group_id, " step ", step, ": ", what));
  };
  DecodedChunk d;
  if (bytes < sizeof(ChunkHeader))
    return bad(absl::StrCat(bytes, " bytes, shorter than the 48-byte header"));
  std::memcpy(&d.header, data, sizeof(ChunkHeader));
  const ChunkHeader& h = d.header;
  if (h.magic != kChunkMagic) return bad("bad magic");
  if (h.version != kChunkVersion)
    return bad(absl::StrCat("wire version ", h.version, ", this daemon speaks 1"));
  if (h.flags & ~(kChunkFp16 | kChunkIndexOnly | kChunkBf16))
    return bad(absl::StrCat("unknown flags 0x", absl::Hex(h.flags)));
  if ((h.flags & kChunkFp16) && (h.flags & kChunkBf16)) return bad("both the fp16 and bf16 flags");
  if (index_only && (h.flags & kChunkFp16)) return bad("the fp16 flag on an index-only chunk");
  if (index_only && (h.flags & kChunkBf16)) return bad("the bf16 flag on an index-only chunk");
  if (((h.flags & kChunkIndexOnly) != 0) != index_only) {
    return bad(index_only ? "a chunk with values where indices alone were expected"
                          : "an index-only chunk where values were expected");
  }
  if (h.group_id != group_id || h.step != step) {
    return bad(absl::StrCat("it is for bucket ", h.group_id, " step ", h.step,
                            " (bucket order differs between nodes)"));
  }
  if (h.elements != elements)
    return bad(absl::StrCat("bucket size ", h.elements, ", here ", elements));
  if (h.count > elements)
    return bad(absl::StrCat("count ", h.count, " exceeds the bucket's ", elements, " elements"));
  const bool fp16 = h.flags & kChunkFp16;
  const bool bf16 = h.flags & kChunkBf16;
  const size_t want = ChunkBytes(h.count, fp16 || bf16, index_only);
  if (bytes != want)
    return bad(absl::StrCat(bytes, " bytes, but count ", h.count, " needs ", want));
  const uint8_t* raw_idx = data + sizeof(ChunkHeader);
  if (reinterpret_cast<uintptr_t>(raw_idx) % alignof(uint32_t) == 0) {
    d.idx = reinterpret_cast<const uint32_t*>(raw_idx);
  } else {
    d.idx_copy.resize(h.count);
    if (h.count) std::memcpy(d.idx_copy.data(), raw_idx, 4ull * h.count);
    d.idx = d.idx_copy.data();
  }
  for (uint32_t i = 0; i < h.count; ++i) {
    uint32_t ix;
    std::memcpy(&ix, data + sizeof(ChunkHeader) + 4ull * i, 4);
    if (ix >= elements)
      return bad(absl::StrCat("index ", ix, " at position ", i, " is outside the bucket (",
                              elements, ")"));
  }
  if (index_only) return d;
  const uint8_t* v = data + sizeof(ChunkHeader) + 4ull * h.count;
  d.values.resize(h.count);
  if (fp16 || bf16) {  // widened exactly by kernels/half.h's conversions
    const DType t = fp16 ? DType::kFloat16 : DType::kBFloat16;
    for (uint32_t i = 0; i < h.count; ++i) {
      uint16_t x;
      std::memcpy(&x, v + 2ull * i, 2);
      d.values[i] = HalfToFloat(t, x);
    }
  } else {
    if (h.count) std::memcpy(d.values.data(), v, 4ull * h.count);
  }
  return d;
}

}  // namespace

absl::StatusOr<DecodedChunk> DecodeChunk(const uint8_t* data, size_t bytes, uint64_t group_id,
                                         uint64_t step, uint32_t elements, int peer) {
  return Decode(data, bytes, group_id, step, elements, peer, false);
}

absl::StatusOr<DecodedChunk> DecodeIndexChunk(const uint8_t* data, size_t bytes, uint64_t group_id,
                                              uint64_t step, uint32_t elements, int peer) {
  return Decode(data, bytes, group_id, step, elements, peer, true);
}

}  // namespace spex
