// Encoding and checked decoding of a node's sparse contribution as it travels between daemons
// (wire.h).
#include "daemon/engine/wire.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

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

size_t RoundUp4(size_t x) { return (x + 3) & ~size_t{3}; }

// The varint gaps of `idx` (wire.h) written at `q`, where up to 4 bytes past `limit` may be
// written. Returns the bytes written (L), or SIZE_MAX when `idx` is not strictly ascending or L
// would exceed `limit` (then the uint32 form is as small or smaller).
size_t PutGaps(absl::Span<const uint32_t> idx, uint8_t* q, size_t limit) {
  uint8_t* const start = q;
  uint8_t* const end = q + limit;
  uint64_t next = 0;  // the smallest index the next entry may have
  for (const uint32_t x : idx) {
    if (x < next) return SIZE_MAX;
    uint32_t g = static_cast<uint32_t>(x - next);
    next = uint64_t{x} + 1;
    // Byte by byte: at the densities spex runs most gaps take one byte, a well-predicted branch
    // (a branch-free form, 8 bytes stored and the length from the bit width, measured 3 to 5x
    // slower: its pointer advance depends on the computed length).
    if (g < 0x80) {
      *q++ = static_cast<uint8_t>(g);
    } else {
      do {
        *q++ = static_cast<uint8_t>(g | 0x80);
        g >>= 7;
      } while (g >= 0x80);
      *q++ = static_cast<uint8_t>(g);
    }
    if (q > end) return SIZE_MAX;
  }
  return static_cast<size_t>(q - start);
}

size_t ValueBytes(uint16_t flags) {
  return (flags & kChunkIndexOnly) ? 0 : (flags & (kChunkFp16 | kChunkBf16)) ? 2 : 4;
}

// Writes the header and the index section of a chunk at out[at..]; `vbytes`: one value's bytes.
// Resizes *out to the chunk's end and returns where the values start.
uint8_t* PutHeaderAndIndices(uint64_t group_id, uint64_t step, uint32_t elements,
                             absl::Span<const uint32_t> idx, uint16_t flags, size_t vbytes,
                             const float scalars[4], IndexEncoding enc, std::vector<uint8_t>* out) {
  const size_t at = out->size();
  const size_t n = idx.size();
  // Room for the uint32 form, which is the largest this writes, plus PutGaps' overshoot.
  out->resize(at + sizeof(ChunkHeader) + 4 * n + vbytes * n + 8);
  uint8_t* p = out->data() + at + sizeof(ChunkHeader);
  size_t section = 4 * n;
  // Delta only when 4 + round_up(L, 4) < 4n, i.e. L <= 4n - 8.
  if (enc == IndexEncoding::kDelta && n >= 2) {
    const size_t len = PutGaps(idx, p + 4, 4 * n - 8);
    if (len != SIZE_MAX) {
      const uint32_t l32 = static_cast<uint32_t>(len);
      std::memcpy(p, &l32, 4);
      section = 4 + RoundUp4(len);
      std::memset(p + 4 + len, 0, section - 4 - len);
      flags |= kChunkDeltaIdx;
    }
  }
  if (!(flags & kChunkDeltaIdx) && n != 0) std::memcpy(p, idx.data(), 4 * n);
  const ChunkHeader h = MakeHeader(group_id, step, elements, n, flags, scalars);
  std::memcpy(out->data() + at, &h, sizeof(h));
  out->resize(at + sizeof(ChunkHeader) + section + vbytes * n);
  return out->data() + at + sizeof(ChunkHeader) + section;
}

}  // namespace

bool AbslParseFlag(absl::string_view text, IndexEncoding* out, std::string* error) {
  if (text == "delta") {
    *out = IndexEncoding::kDelta;
  } else if (text == "u32") {
    *out = IndexEncoding::kU32;
  } else {
    *error = absl::StrCat("unknown index encoding '", text, "' (delta or u32)");
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(IndexEncoding v) {
  return v == IndexEncoding::kDelta ? "delta" : "u32";
}

size_t ChunkLength(const uint8_t* data, size_t avail) {
  if (avail < sizeof(ChunkHeader)) return sizeof(ChunkHeader);
  ChunkHeader h;
  std::memcpy(&h, data, sizeof(h));
  const size_t values = static_cast<size_t>(h.count) * ValueBytes(h.flags);
  if (!(h.flags & kChunkDeltaIdx)) return sizeof(ChunkHeader) + 4ull * h.count + values;
  if (avail < sizeof(ChunkHeader) + 4) return sizeof(ChunkHeader) + 4;
  uint32_t len;
  std::memcpy(&len, data + sizeof(ChunkHeader), 4);
  return sizeof(ChunkHeader) + 4 + RoundUp4(len) + values;
}

size_t IndexSectionBytes(absl::Span<const uint32_t> idx, IndexEncoding enc) {
  const size_t n = idx.size();
  if (enc != IndexEncoding::kDelta || n < 2) return 4 * n;
  size_t len = 0;
  uint64_t next = 0;
  for (const uint32_t x : idx) {
    if (x < next) return 4 * n;
    const uint32_t g = static_cast<uint32_t>(x - next);
    next = uint64_t{x} + 1;
    len += g < (1u << 7) ? 1 : g < (1u << 14) ? 2 : g < (1u << 21) ? 3 : g < (1u << 28) ? 4 : 5;
  }
  return len <= 4 * n - 8 ? 4 + RoundUp4(len) : 4 * n;
}

size_t ChunkBytes(uint32_t count, bool fp16, bool index_only) {
  return sizeof(ChunkHeader) + static_cast<size_t>(count) * (4 + (index_only ? 0 : fp16 ? 2 : 4));
}

void EncodeChunk(uint64_t group_id, uint64_t step, uint32_t elements,
                 absl::Span<const uint32_t> idx, absl::Span<const float> val, bool fp16,
                 const float scalars[4], std::vector<uint8_t>* out, IndexEncoding enc) {
  EncodeChunk(group_id, step, elements, idx, val, fp16 ? DType::kFloat16 : DType::kFloat32, scalars,
              out, enc);
}

void EncodeChunk(uint64_t group_id, uint64_t step, uint32_t elements,
                 absl::Span<const uint32_t> idx, absl::Span<const float> val, DType wire,
                 const float scalars[4], std::vector<uint8_t>* out, IndexEncoding enc) {
  wire = ValuesWire(wire, val.first(std::min(val.size(), idx.size())));
  const uint16_t flag = wire == DType::kFloat16    ? kChunkFp16
                        : wire == DType::kBFloat16 ? kChunkBf16
                                                   : 0;
  const size_t vbytes = IsHalf(wire) ? 2 : 4;
  uint8_t* p = PutHeaderAndIndices(group_id, step, elements, idx, flag, vbytes, scalars, enc, out);
  // The chunk holds idx.size() values: a shorter `val` leaves zeros, a longer one is cut.
  const size_t nv = std::min(val.size(), idx.size());
  std::memset(p + nv * vbytes, 0, (idx.size() - nv) * vbytes);
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
                      std::vector<uint8_t>* out, IndexEncoding enc) {
  PutHeaderAndIndices(group_id, step, elements, idx, kChunkIndexOnly, 0, scalars, enc, out);
}

namespace {

// What is wrong with a chunk's header for this bucket and step ("" when nothing is).
std::string HeaderProblem(const ChunkHeader& h, uint64_t group_id, uint64_t step, uint32_t elements,
                          bool index_only) {
  if (h.magic != kChunkMagic) return "bad magic";
  if (h.version != kChunkVersion)
    return absl::StrCat("wire version ", h.version, ", this daemon speaks 1");
  if (h.flags & ~(kChunkFp16 | kChunkIndexOnly | kChunkBf16 | kChunkDeltaIdx))
    return absl::StrCat("unknown flags 0x", absl::Hex(h.flags));
  if ((h.flags & kChunkFp16) && (h.flags & kChunkBf16)) return "both the fp16 and bf16 flags";
  if (index_only && (h.flags & kChunkFp16)) return "the fp16 flag on an index-only chunk";
  if (index_only && (h.flags & kChunkBf16)) return "the bf16 flag on an index-only chunk";
  if (((h.flags & kChunkIndexOnly) != 0) != index_only) {
    return index_only ? "a chunk with values where indices alone were expected"
                      : "an index-only chunk where values were expected";
  }
  if (h.group_id != group_id || h.step != step) {
    return absl::StrCat("it is for bucket ", h.group_id, " step ", h.step,
                        " (bucket order differs between nodes)");
  }
  if (h.elements != elements) return absl::StrCat("bucket size ", h.elements, ", here ", elements);
  if (h.count > elements)
    return absl::StrCat("count ", h.count, " exceeds the bucket's ", elements, " elements");
  return "";
}

// The uint32 index section: d->idx (into the bytes where aligned), *v the value section. What is
// wrong ("" when nothing is).
std::string U32Indices(const uint8_t* data, size_t bytes, const ChunkHeader& h, uint32_t elements,
                       bool half, bool index_only, DecodedChunk* d, const uint8_t** v) {
  const size_t want = ChunkBytes(h.count, half, index_only);
  if (bytes != want) return absl::StrCat(bytes, " bytes, but count ", h.count, " needs ", want);
  const uint8_t* raw_idx = data + sizeof(ChunkHeader);
  if (reinterpret_cast<uintptr_t>(raw_idx) % alignof(uint32_t) == 0) {
    d->idx = reinterpret_cast<const uint32_t*>(raw_idx);
  } else {
    d->idx_copy.resize(h.count);
    if (h.count) std::memcpy(d->idx_copy.data(), raw_idx, 4ull * h.count);
    d->idx = d->idx_copy.data();
  }
  for (uint32_t i = 0; i < h.count; ++i) {
    uint32_t ix;
    std::memcpy(&ix, data + sizeof(ChunkHeader) + 4ull * i, 4);
    if (ix >= elements)
      return absl::StrCat("index ", ix, " at position ", i, " is outside the bucket (", elements,
                          ")");
  }
  *v = data + sizeof(ChunkHeader) + 4ull * h.count;
  return "";
}

// The delta index section (wire.h): a length word, the varints, zero padding, then the values
// (vbytes each). d->idx points into d->idx_copy, *v the value section. What is wrong ("" when
// nothing is).
std::string DeltaIndices(const uint8_t* data, size_t bytes, const ChunkHeader& h, uint32_t elements,
                         size_t vbytes, DecodedChunk* d, const uint8_t** v) {
  // Delta form (wire.h): a length word, the varints, zero padding, then the values.
  const size_t values = static_cast<size_t>(h.count) * vbytes;
  if (bytes < sizeof(ChunkHeader) + 4)
    return absl::StrCat(bytes, " bytes end before the delta index section's length");
  uint32_t len;
  std::memcpy(&len, data + sizeof(ChunkHeader), 4);
  const size_t want = sizeof(ChunkHeader) + 4 + RoundUp4(len) + values;
  if (bytes != want) {
    return absl::StrCat(bytes, " bytes, but a delta index section of ", len, " bytes and count ",
                        h.count, " need ", want);
  }
  if (h.count > len) {  // every entry takes at least one byte
    return absl::StrCat("count ", h.count, " entries cannot fit a delta index section of ", len,
                        " bytes");
  }
  const uint8_t* p = data + sizeof(ChunkHeader) + 4;
  const uint8_t* const end = p + len;
  d->idx_copy.resize(h.count);
  uint32_t* out = d->idx_copy.data();
  uint64_t next = 0;  // the smallest index the next entry may have
  for (uint32_t i = 0; i < h.count; ++i) {
    if (p == end) {
      return absl::StrCat("the delta index section (", len, " bytes) ends at entry ", i, " of ",
                          h.count);
    }
    uint64_t g = *p++;
    if (g >= 0x80) {  // more groups: at most 5 bytes, minimal, below 2^32
      g &= 0x7f;
      int shift = 7;
      for (;;) {
        if (p == end) {
          return absl::StrCat("the varint of entry ", i,
                              " is cut off by the end of the delta index section (", len,
                              " bytes)");
        }
        const uint8_t b = *p++;
        g |= uint64_t{b & 0x7fu} << shift;
        if (b < 0x80) {
          if (b == 0) return absl::StrCat("the varint of entry ", i, " is not minimal");
          break;
        }
        shift += 7;
        if (shift == 35) return absl::StrCat("the varint of entry ", i, " is longer than 5 bytes");
      }
      if (g > UINT32_MAX) return absl::StrCat("the varint of entry ", i, " is ", g, ", past 2^32");
    }
    const uint64_t ix = next + g;  // strictly ascending by construction
    if (ix >= elements) {
      return absl::StrCat("index ", ix, " at position ", i, " is outside the bucket (", elements,
                          ")");
    }
    out[i] = static_cast<uint32_t>(ix);
    next = ix + 1;
  }
  if (p != end) {
    return absl::StrCat("the delta index section says ", len, " bytes, but its ", h.count,
                        " entries take ", p - (data + sizeof(ChunkHeader) + 4));
  }
  for (const uint8_t* q = end; q < data + sizeof(ChunkHeader) + 4 + RoundUp4(len); ++q) {
    if (*q != 0) return "nonzero padding after the delta index section";
  }
  d->idx = d->idx_copy.data();
  *v = data + sizeof(ChunkHeader) + 4 + RoundUp4(len);

  return "";
}

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
  if (std::string what = HeaderProblem(h, group_id, step, elements, index_only); !what.empty())
    return bad(what);
  const bool fp16 = h.flags & kChunkFp16;
  const bool bf16 = h.flags & kChunkBf16;
  const size_t vbytes = index_only ? 0 : (fp16 || bf16) ? 2 : 4;
  const uint8_t* v = nullptr;  // the value section
  const std::string what =
      (h.flags & kChunkDeltaIdx)
          ? DeltaIndices(data, bytes, h, elements, vbytes, &d, &v)
          : U32Indices(data, bytes, h, elements, fp16 || bf16, index_only, &d, &v);
  if (!what.empty()) return bad(what);
  d.bytes = bytes;
  if (index_only) return d;
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
