// libFuzzer target: the peer chunk decoder (daemon/engine/wire.h). Arbitrary bytes go to
// DecodeChunk and DecodeIndexChunk twice: once against expectations taken from the first
// bytes of the input (most inputs are refused early), once against the chunk's own header
// (group, step, elements; elements capped), so the fuzzer reaches the length, index and value
// checks. A decoded chunk must be consistent (every index < elements, byte length exact), and
// re-encoding it must give the same bytes back.
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
  const spex::DType wire = fp16   ? spex::DType::kFloat16
                           : bf16 ? spex::DType::kBFloat16
                                  : spex::DType::kFloat32;
  Check(d.header.count <= elements);
  Check(size == spex::ChunkBytes(d.header.count, fp16 || bf16, index_only));
  for (uint32_t i = 0; i < d.header.count; ++i) {
    uint32_t ix;
    std::memcpy(&ix, reinterpret_cast<const uint8_t*>(d.idx) + 4ull * i, 4);
    Check(ix < elements);
  }
  Check(index_only ? d.values.empty() : d.values.size() == d.header.count);
  // Re-encoding gives the same bytes (half values round-trip through float exactly).
  std::vector<uint32_t> idx(d.header.count);
  if (d.header.count) std::memcpy(idx.data(), d.idx, 4ull * d.header.count);
  std::vector<uint8_t> again;
  if (index_only) {
    spex::EncodeIndexChunk(d.header.group_id, d.header.step, d.header.elements, idx,
                           d.header.scalars, &again);
  } else {
    spex::EncodeChunk(d.header.group_id, d.header.step, d.header.elements, idx, d.values, wire,
                      d.header.scalars, &again);
  }
  Check(again.size() == size);
  // NaN payloads in half values may canonicalise: compare the header and the indices only.
  // DecodeIndexChunk tolerates the (meaningless) fp16 flag on an index-only chunk, which
  // EncodeIndexChunk never sets: compare the headers without it.
  spex::ChunkHeader h0 = d.header, h1;
  std::memcpy(&h1, again.data(), sizeof(h1));
  if (index_only) h0.flags &= ~(spex::kChunkFp16 | spex::kChunkBf16);
  Check(std::memcmp(&h0, &h1, sizeof(h0)) == 0);
  Check(std::memcmp(again.data() + sizeof(h1), data + sizeof(h1), 4ull * d.header.count) == 0);
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
