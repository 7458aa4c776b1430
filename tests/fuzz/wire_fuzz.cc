// libFuzzer target: the peer chunk decoder (daemon/engine/wire.h). Arbitrary bytes go to
// DecodeChunk and DecodeIndexChunk twice: once against expectations taken from the first
// bytes of the input (most inputs are refused early), once against the chunk's own header
// (group, step, elements; elements capped), so the fuzzer reaches the length, index and value
// checks, and the delta index section's (kChunkDeltaIdx: varints, length word, padding). A
// decoded chunk must be consistent (every index < elements, strictly ascending in the delta
// form, byte length exact and what ChunkLength reads), and re-encoding it in its own form must
// give the same bytes back (in the other form, the same indices).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "daemon/engine/wire.h"
#include "kernels/half.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckDecoded(const spex::DecodedChunk& d, const uint8_t* data, size_t size, uint32_t elements,
                  bool index_only) {
  const bool fp16 = d.header.flags & spex::kChunkFp16;
  const bool bf16 = d.header.flags & spex::kChunkBf16;
  const bool delta = d.header.flags & spex::kChunkDeltaIdx;
  const spex::DType wire = fp16   ? spex::DType::kFloat16
                           : bf16 ? spex::DType::kBFloat16
                                  : spex::DType::kFloat32;
  Check(d.header.count <= elements);
  Check(d.bytes == size);
  Check(spex::ChunkLength(data, size) == size);  // what a reader of a concatenation would find
  if (!delta) Check(size == spex::ChunkBytes(d.header.count, fp16 || bf16, index_only));
  std::vector<uint32_t> idx(d.header.count);
  if (d.header.count) std::memcpy(idx.data(), d.idx, 4ull * d.header.count);
  for (uint32_t i = 0; i < d.header.count; ++i) {
    Check(idx[i] < elements);
    if (delta && i > 0) Check(idx[i] > idx[i - 1]);  // the delta form is strictly ascending
  }
  Check(index_only ? d.values.empty() : d.values.size() == d.header.count);
  // Re-encoding in the chunk's form gives the same bytes (half values round-trip through float
  // exactly; the delta form is canonical: minimal varints, zero padding, exact length), unless
  // the encoder finds the delta form not smaller and writes uint32 indices (it never writes a
  // delta section that is not smaller; a peer may). Either way the indices decode the same.
  for (spex::IndexEncoding enc : {spex::IndexEncoding::kU32, spex::IndexEncoding::kDelta}) {
    std::vector<uint8_t> again;
    if (index_only) {
      spex::EncodeIndexChunk(d.header.group_id, d.header.step, d.header.elements, idx,
                             d.header.scalars, &again, enc);
    } else {
      spex::EncodeChunk(d.header.group_id, d.header.step, d.header.elements, idx, d.values, wire,
                        d.header.scalars, &again, enc);
    }
    Check(again.size() == spex::ChunkLength(again.data(), again.size()));
    spex::ChunkHeader h0 = d.header, h1;
    std::memcpy(&h1, again.data(), sizeof(h1));
    const bool again_delta = h1.flags & spex::kChunkDeltaIdx;
    Check(again_delta == (enc == spex::IndexEncoding::kDelta &&
                          spex::IndexSectionBytes(idx, enc) < 4ull * idx.size()));
    auto back = index_only ? spex::DecodeIndexChunk(again.data(), again.size(), h1.group_id,
                                                    h1.step, h1.elements, 0)
                           : spex::DecodeChunk(again.data(), again.size(), h1.group_id, h1.step,
                                               h1.elements, 0);
    Check(back.ok());
    Check(back->header.count == d.header.count);
    if (d.header.count) Check(std::memcmp(back->idx, idx.data(), 4ull * d.header.count) == 0);
    if (again_delta != delta) continue;
    Check(again.size() == size);
    // NaN payloads in half values may canonicalise: compare the header and the indices only.
    // DecodeIndexChunk refuses half flags on an index-only chunk; clear them anyway.
    if (index_only) h0.flags &= ~(spex::kChunkFp16 | spex::kChunkBf16);
    Check(std::memcmp(&h0, &h1, sizeof(h0)) == 0);
    const size_t section = size - sizeof(h1) - d.values.size() * (fp16 || bf16 ? 2 : 4);
    Check(std::memcmp(again.data() + sizeof(h1), data + sizeof(h1), section) == 0);
  }
}

void Try(const uint8_t* data, size_t size, uint64_t group, uint64_t step, uint32_t elements) {
  auto full = spex::DecodeChunk(data, size, group, step, elements, /*peer=*/1);
  if (full.ok()) CheckDecoded(*full, data, size, elements, false);
  auto index = spex::DecodeIndexChunk(data, size, group, step, elements, /*peer=*/1);
  if (index.ok()) CheckDecoded(*index, data, size, elements, true);
  Check(!(full.ok() && index.ok()));  // the flag decides which decoder accepts
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Against fixed expectations.
  Try(data, size, 7, 3, 1000);
  // Against the chunk's own header, so the deeper checks are reached.
  if (size >= sizeof(spex::ChunkHeader)) {
    spex::ChunkHeader h;
    std::memcpy(&h, data, sizeof(h));
    Try(data, size, h.group_id, h.step, h.elements);
  }
  // Half conversions (kernels/half.h, the wire's): widening then rounding gives the same value
  // back (non-NaN), for float16 and bfloat16.
  for (size_t i = 0; i + 2 <= size && i < 64; i += 2) {
    uint16_t x;
    std::memcpy(&x, data + i, 2);
    for (spex::DType t : {spex::DType::kFloat16, spex::DType::kBFloat16}) {
      const float f = spex::HalfToFloat(t, x);
      if (f == f) Check(spex::HalfToFloat(t, spex::FloatToHalf(t, f)) == f);
    }
  }
  return 0;
}
