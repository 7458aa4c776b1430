#include "daemon/engine/wire.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "daemon/engine/half_exchange.h"
#include "daemon/engine/oktopk_exchange.h"
#include "daemon/engine/sparse_exchange.h"
#include "gtest/gtest.h"
#include "kernels/half.h"
#include "kernels/primitives.h"
#include "tests/support/collective_conformance.h"

// The conformance suite comes with Spawn's library; this binary does not run it.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CollectiveConformance);

namespace spex {
namespace {

TEST(Wire, RoundTripFp32AndFp16) {
  std::vector<uint32_t> idx = {0, 5, 99};
  std::vector<float> val = {1.5f, -2.25f, 65504.0f};
  for (bool fp16 : {false, true}) {
    std::vector<uint8_t> buf;
    EncodeChunk(7, 3, 100, idx, val, fp16, nullptr, &buf, IndexEncoding::kU32);
    ASSERT_EQ(buf.size(), ChunkBytes(3, fp16));
    auto d = DecodeChunk(buf.data(), buf.size(), 7, 3, 100, 1);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->header.count, 3u);
    EXPECT_EQ(d->idx[2], 99u);
    EXPECT_EQ(d->values, val);  // all three are exact in fp16
  }
}

// In a gathered buffer a chunk that follows an fp16 chunk with an odd count starts 2 bytes off
// 4-byte alignment; the decoded indices must still be safe to read as uint32_t.
// A value that would round to +-Inf in the half type asked for (float16 past 65,504, bfloat16
// next to float32's largest) makes the chunk float32: decoded exactly, never as an infinity
// (docs/dtypes.md#values-past-the-types-range). A chunk whose values fit stays half.
TEST(Wire, AValuePastTheHalfRangeSendsTheChunkAsFloat32) {
  const std::vector<uint32_t> idx = {1, 5, 9};
  const float scalars[4] = {};
  struct Case {
    DType t;
    float big;
  };
  for (const Case& c : {Case{DType::kFloat16, 80000.0f}, Case{DType::kFloat16, 65520.0f},
                        Case{DType::kBFloat16, BitsFloat(0x7f7f8000u)}}) {
    const std::vector<float> val = {0.5f, c.big, -3.0f};
    EXPECT_EQ(ValuesWire(c.t, val), DType::kFloat32);
    std::vector<uint8_t> buf;
    EncodeChunk(7, 3, 10, idx, val, c.t, scalars, &buf, IndexEncoding::kU32);
    EXPECT_EQ(buf.size(), ChunkBytes(3, false));
    auto d = DecodeChunk(buf.data(), buf.size(), 7, 3, 10, 0);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->header.flags, 0);
    EXPECT_EQ(d->values, val);
  }
  // The bool form (--fp16_values) too; and 65,504 (float16's largest) fits.
  std::vector<uint8_t> buf;
  EncodeChunk(7, 3, 10, idx, std::vector<float>{1.0f, -70000.0f, 2.0f}, /*fp16=*/true, scalars,
              &buf, IndexEncoding::kU32);
  EXPECT_EQ(buf.size(), ChunkBytes(3, false));
  const std::vector<float> fits = {0.5f, 65504.0f, -65519.0f};
  EXPECT_EQ(ValuesWire(DType::kFloat16, fits), DType::kFloat16);
  buf.clear();
  EncodeChunk(7, 3, 10, idx, fits, DType::kFloat16, scalars, &buf, IndexEncoding::kU32);
  EXPECT_EQ(buf.size(), ChunkBytes(3, true));
  auto d = DecodeChunk(buf.data(), buf.size(), 7, 3, 10, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->values, (std::vector<float>{0.5f, 65504.0f, -65504.0f}));
}

// HalfFits (kernels/half.h) is exactly "rounds to a finite value, or was not finite": every
// float around both types' overflow boundaries, and a sweep over all exponents.
TEST(Wire, HalfFitsIsTheRoundTripsFiniteness) {
  size_t wrong = 0;
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    auto check = [&](uint32_t bits) {
      const float v = BitsFloat(bits);
      const bool want = !std::isfinite(v) || std::isfinite(HalfToFloat(t, FloatToHalf(t, v)));
      wrong += HalfFits(t, v) != want;
    };
    for (uint32_t sign : {0u, 0x80000000u}) {
      for (uint32_t at : {0x477ff000u, 0x7f7f8000u, 0x7f800000u}) {
        for (uint32_t d = 0; d < 4096; ++d) check(sign | (at - 2048 + d));
      }
      for (uint32_t bits = 0; bits < 0x80000000u; bits += 0x1001) check(sign | bits);
    }
  }
  EXPECT_EQ(wrong, 0u);
}

TEST(Wire, ChunkAtAnOddOffsetDecodesToAlignedIndices) {
  std::vector<uint32_t> idx = {1, 4, 9};
  std::vector<float> val = {1.0f, 2.0f, 3.0f};
  std::vector<uint8_t> chunk;
  EncodeChunk(7, 3, 10, idx, val, true, nullptr, &chunk, IndexEncoding::kU32);
  for (size_t shift : {0, 1, 2, 3}) {
    std::vector<uint8_t> buf(chunk.size() + 4);
    std::memcpy(buf.data() + shift, chunk.data(), chunk.size());
    auto d = DecodeChunk(buf.data() + shift, chunk.size(), 7, 3, 10, 0);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d->idx) % alignof(uint32_t), 0u) << "shift " << shift;
    EXPECT_EQ(std::vector<uint32_t>(d->idx, d->idx + 3), idx);
    DecodedChunk moved = std::move(*d);  // the copy (when one was made) moves with the chunk
    EXPECT_EQ(std::vector<uint32_t>(moved.idx, moved.idx + 3), idx);
  }
}

// The chunk's half values are kernels/half.h's conversions (the wire has no conversion of its
// own): every one of the 65536 bit patterns of each half type, and floats that must round, go
// out as FloatToHalf's bits and come back as HalfToFloat's value, bit for bit.
TEST(Wire, HalfValuesAreKernelsHalfConversions) {
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(t));
    const uint16_t flag = t == DType::kFloat16 ? kChunkFp16 : kChunkBf16;
    std::vector<float> val;
    for (uint32_t h = 0; h < 65536; ++h) val.push_back(HalfToFloat(t, static_cast<uint16_t>(h)));
    // Between representable values (ties go to even), below the smallest subnormal, the largest
    // values that still fit, NaN with a payload, negative zero. (A value that would round to
    // +-Inf makes the chunk float32: AValuePastTheHalfRangeSendsTheChunkAsFloat32.)
    const bool f16 = t == DType::kFloat16;
    for (float f : {1.0f / 3, 1e-7f, 1e-9f, -2.5e-8f, f16 ? 6e4f : 1e6f, f16 ? -6e4f : -7e4f,
                    f16 ? BitsFloat(0x477fefffu) : 65520.0f, 65519.0f, f16 ? 1e4f : 3e38f,
                    1.00048828125f, 1.00146484375f, -0.0f}) {
      val.push_back(f);
    }
    val.push_back(BitsFloat(0x7fa00001u));  // a signalling NaN with a payload
    std::vector<uint32_t> idx(val.size());
    for (uint32_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::vector<uint8_t> buf;
    EncodeChunk(9, 1, idx.size(), idx, val, t, nullptr, &buf, IndexEncoding::kU32);
    ASSERT_EQ(buf.size(), ChunkBytes(idx.size(), true));
    ChunkHeader h;
    std::memcpy(&h, buf.data(), sizeof(h));
    EXPECT_EQ(h.flags, flag);
    const uint8_t* vals = buf.data() + sizeof(ChunkHeader) + 4 * idx.size();
    auto d = DecodeChunk(buf.data(), buf.size(), 9, 1, idx.size(), 0);
    ASSERT_TRUE(d.ok()) << d.status();
    size_t wrong_bits = 0, wrong_values = 0;
    for (size_t i = 0; i < val.size(); ++i) {
      uint16_t bits;
      std::memcpy(&bits, vals + 2 * i, 2);
      wrong_bits += bits != FloatToHalf(t, val[i]);
      wrong_values += FloatBits(d->values[i]) != FloatBits(HalfToFloat(t, bits));
    }
    EXPECT_EQ(wrong_bits, 0u);
    EXPECT_EQ(wrong_values, 0u);
    // Spot checks of the rounding itself, through the chunk.
    const size_t at = 65536;
    if (t == DType::kFloat16) {
      EXPECT_EQ(d->values[at], 0.333251953125f);
      EXPECT_EQ(d->values[at + 1], 1.1920928955078125e-07f);  // a subnormal
      EXPECT_EQ(d->values[at + 2], 0.0f);                     // below half the smallest one
      EXPECT_EQ(d->values[at + 4], 60000.0f);
      EXPECT_EQ(d->values[at + 6], 65504.0f);  // the float below 65,520 (the tie to Inf)
      EXPECT_EQ(d->values[at + 7], 65504.0f);
      EXPECT_EQ(d->values[at + 9], 1.0f);           // a tie: to even
      EXPECT_EQ(d->values[at + 10], 1.001953125f);  // a tie: to even (up)
    } else {
      EXPECT_EQ(d->values[at], 0.333984375f);
      EXPECT_EQ(d->values[at + 4], 999424.0f);
    }
    EXPECT_TRUE(std::signbit(d->values[at + 11]));  // -0 keeps its sign
    EXPECT_EQ(d->values[at + 11], 0.0f);
    EXPECT_TRUE(std::isnan(d->values[at + 12]));  // a NaN stays a NaN, quiet
    EXPECT_NE(FloatBits(d->values[at + 12]) & 0x400000u, 0u);
  }
}

TEST(Wire, MalformedChunksAreRejectedBeforeAnyWrite) {
  std::vector<uint32_t> idx = {1, 2};
  std::vector<float> val = {1, 2};
  std::vector<uint8_t> good;
  EncodeChunk(1, 0, 10, idx, val, false, nullptr, &good, IndexEncoding::kU32);
  auto code = [&](std::vector<uint8_t> b, uint64_t group = 1, uint64_t step = 0, uint32_t n = 10) {
    return DecodeChunk(b.data(), b.size(), group, step, n, 3).status();
  };
  EXPECT_TRUE(code(good).ok());
  EXPECT_EQ(code({1, 2, 3}).code(), absl::StatusCode::kDataLoss);  // short
  auto b = good;
  b[0] ^= 1;
  EXPECT_NE(code(b).message().find("magic"), std::string::npos);
  EXPECT_NE(code(good, 2).message().find("order differs"), std::string::npos);     // other bucket
  EXPECT_NE(code(good, 1, 1).message().find("order differs"), std::string::npos);  // other step
  EXPECT_NE(code(good, 1, 0, 11).message().find("bucket size"), std::string::npos);
  // A count larger than the bucket.
  b = good;
  uint32_t big = 11;
  std::memcpy(b.data() + offsetof(ChunkHeader, count), &big, 4);
  EXPECT_NE(code(b).message().find("exceeds"), std::string::npos);
  // A count that does not match the byte length.
  b = good;
  uint32_t three = 3;
  std::memcpy(b.data() + offsetof(ChunkHeader, count), &three, 4);
  EXPECT_NE(code(b).message().find("needs"), std::string::npos);
  // An index outside the bucket.
  b = good;
  uint32_t out = 10;
  std::memcpy(b.data() + sizeof(ChunkHeader) + 4, &out, 4);
  absl::Status s = code(b);
  EXPECT_NE(s.message().find("index 10"), std::string::npos) << s;
  EXPECT_NE(s.message().find("node 3"), std::string::npos) << s;
}

TEST(Wire, IndexOnlyChunksHaveTheirOwnDecoder) {
  std::vector<uint32_t> idx = {0, 4, 9};
  std::vector<uint8_t> chunk;
  EncodeIndexChunk(5, 2, 10, idx, nullptr, &chunk, IndexEncoding::kU32);
  ASSERT_EQ(chunk.size(), sizeof(ChunkHeader) + 3 * 4);
  auto d = DecodeIndexChunk(chunk.data(), chunk.size(), 5, 2, 10, 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->header.count, 3u);
  EXPECT_EQ(std::vector<uint32_t>(d->idx, d->idx + 3), idx);
  EXPECT_TRUE(d->values.empty());
  // The other decoder refuses it, and this one refuses a chunk with values.
  auto as_values = DecodeChunk(chunk.data(), chunk.size(), 5, 2, 10, 1);
  EXPECT_EQ(as_values.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(as_values.status().message().find("index-only"), std::string::npos);
  std::vector<float> val = {1, 2, 3};
  std::vector<uint8_t> with_values;
  EncodeChunk(5, 2, 10, idx, val, false, nullptr, &with_values, IndexEncoding::kU32);
  EXPECT_EQ(DecodeIndexChunk(with_values.data(), with_values.size(), 5, 2, 10, 1).status().code(),
            absl::StatusCode::kDataLoss);
  // Version, length and index checks apply as to every chunk.
  auto b = chunk;
  b[offsetof(ChunkHeader, version)] = 9;
  EXPECT_NE(DecodeIndexChunk(b.data(), b.size(), 5, 2, 10, 1).status().message().find("version"),
            std::string::npos);
  b = chunk;
  b[offsetof(ChunkHeader, flags)] |= kChunkFp16;
  EXPECT_NE(DecodeIndexChunk(b.data(), b.size(), 5, 2, 10, 1).status().message().find("fp16"),
            std::string::npos);
  b = chunk;
  b.resize(b.size() - 1);
  EXPECT_NE(DecodeIndexChunk(b.data(), b.size(), 5, 2, 10, 1).status().message().find("needs"),
            std::string::npos);
  b = chunk;
  uint32_t out = 10;
  std::memcpy(b.data() + sizeof(ChunkHeader) + 8, &out, 4);
  auto bad = DecodeIndexChunk(b.data(), b.size(), 5, 2, 10, 1);
  EXPECT_NE(bad.status().message().find("index 10"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("node 1"), std::string::npos) << bad.status();
}

// A bfloat16 bucket's chunk: 2-byte values rounded to nearest even, flagged kChunkBf16; a chunk
// flagged both fp16 and bf16, or a half flag on an index-only chunk, is refused.
TEST(Wire, Bf16ValuesRoundTripAndBadFlagsAreRefused) {
  std::vector<uint32_t> idx = {0, 5, 99};
  std::vector<float> val = {1.5f, -2.25f, 1.00390625f};  // the last is a tie: rounds to 1.0
  std::vector<uint8_t> buf;
  EncodeChunk(7, 3, 100, idx, val, DType::kBFloat16, nullptr, &buf, IndexEncoding::kU32);
  ASSERT_EQ(buf.size(), ChunkBytes(3, true));
  auto d = DecodeChunk(buf.data(), buf.size(), 7, 3, 100, 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->values, (std::vector<float>{1.5f, -2.25f, 1.0f}));
  ChunkHeader h;
  std::memcpy(&h, buf.data(), sizeof(h));
  EXPECT_EQ(h.flags, kChunkBf16);
  h.flags = kChunkBf16 | kChunkFp16;
  std::memcpy(buf.data(), &h, sizeof(h));
  auto both = DecodeChunk(buf.data(), buf.size(), 7, 3, 100, 1);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("both the fp16 and bf16"), std::string::npos);
  std::vector<uint8_t> ix;
  EncodeIndexChunk(7, 3, 100, idx, nullptr, &ix, IndexEncoding::kU32);
  std::memcpy(&h, ix.data(), sizeof(h));
  h.flags |= kChunkBf16;
  std::memcpy(ix.data(), &h, sizeof(h));
  auto half_ix = DecodeIndexChunk(ix.data(), ix.size(), 7, 3, 100, 1);
  ASSERT_FALSE(half_ix.ok());
  EXPECT_NE(half_ix.status().message().find("index-only"), std::string::npos);
}

// ---- The delta form of the index section (kChunkDeltaIdx, wire.h) ----

// A strictly ascending set: every index of [0, elements) kept with probability `density`.
std::vector<uint32_t> AscendingSet(uint32_t elements, double density, uint32_t seed) {
  std::mt19937_64 gen(seed);
  std::bernoulli_distribution keep(density);
  std::vector<uint32_t> idx;
  for (uint32_t i = 0; i < elements; ++i) {
    if (keep(gen)) idx.push_back(i);
  }
  return idx;
}

ChunkHeader HeaderOf(const std::vector<uint8_t>& b) {
  ChunkHeader h;
  std::memcpy(&h, b.data(), sizeof(h));
  return h;
}

// Random ascending sets from density 0.5 to 1e-5, in index-only chunks and chunks with float32,
// float16 and bfloat16 values: the delta form is chosen, is smaller than uint32 indices, its
// length is what IndexSectionBytes and ChunkLength say, and it decodes to the same indices and
// values, also at every alignment (a chunk after a 2-byte-value chunk starts 2 bytes off).
TEST(WireDelta, RoundTripsRandomAscendingSetsAtEveryDensity) {
  const uint32_t n = 1 << 20;
  const float scalars[4] = {0.5f, 1, 2, 3};
  for (double density : {0.5, 0.1, 0.01, 1e-3, 1e-4, 1e-5}) {
    SCOPED_TRACE(testing::Message() << "density " << density);
    const std::vector<uint32_t> idx = AscendingSet(n, density, 17);
    ASSERT_GE(idx.size(), 2u);
    std::vector<float> val(idx.size());
    for (size_t j = 0; j < val.size(); ++j) val[j] = 0.25f * static_cast<float>(j % 64) - 3;
    for (int kind = 0; kind < 4; ++kind) {  // index-only, float32, float16, bfloat16
      const DType t = kind == 2 ? DType::kFloat16 : kind == 3 ? DType::kBFloat16 : DType::kFloat32;
      const size_t vbytes = kind == 0 ? 0 : IsHalf(t) ? 2 : 4;
      std::vector<uint8_t> buf;
      if (kind == 0) {
        EncodeIndexChunk(4, 9, n, idx, scalars, &buf, IndexEncoding::kDelta);
      } else {
        EncodeChunk(4, 9, n, idx, val, t, scalars, &buf, IndexEncoding::kDelta);
      }
      ASSERT_NE(HeaderOf(buf).flags & kChunkDeltaIdx, 0) << kind;
      const size_t section = IndexSectionBytes(idx, IndexEncoding::kDelta);
      EXPECT_EQ(section % 4, 0u);
      EXPECT_LT(section, 4 * idx.size());
      EXPECT_EQ(buf.size(), sizeof(ChunkHeader) + section + vbytes * idx.size());
      EXPECT_EQ(ChunkLength(buf.data(), buf.size()), buf.size());
      for (size_t shift : {0, 1, 2, 3}) {
        std::vector<uint8_t> at(buf.size() + 4);
        std::memcpy(at.data() + shift, buf.data(), buf.size());
        auto d = kind == 0 ? DecodeIndexChunk(at.data() + shift, buf.size(), 4, 9, n, 2)
                           : DecodeChunk(at.data() + shift, buf.size(), 4, 9, n, 2);
        ASSERT_TRUE(d.ok()) << d.status();
        EXPECT_EQ(d->bytes, buf.size());
        EXPECT_EQ(d->idx, d->idx_copy.data());
        ASSERT_EQ(d->header.count, idx.size());
        EXPECT_TRUE(std::equal(idx.begin(), idx.end(), d->idx));
        EXPECT_EQ(d->header.scalars[0], 0.5f);
        if (kind == 0) {
          EXPECT_TRUE(d->values.empty());
        } else {
          // These values are exact in every type.
          EXPECT_EQ(d->values, val);
        }
      }
    }
  }
}

// Gaps that need 1 to 5 varint bytes (either side of 2^7, 2^14, 2^21, 2^28), up to the largest
// index a bucket can have (2^32 - 2 in a bucket of 2^32 - 1 elements).
TEST(WireDelta, GapsOfEveryVarintLengthUpToTheLastIndex) {
  std::vector<uint32_t> idx;
  for (uint32_t i = 0; i < 64; ++i) idx.push_back(i);  // 1-byte gaps make the form smaller
  for (uint64_t gap : {127ull, 128ull, 16383ull, 16384ull, 2097151ull, 2097152ull, 268435455ull,
                       268435456ull, 268435457ull}) {
    idx.push_back(static_cast<uint32_t>(idx.back() + 1 + gap));
  }
  idx.push_back(4294967294u);
  const uint32_t n = 4294967295u;
  std::vector<uint8_t> buf;
  EncodeIndexChunk(1, 1, n, idx, nullptr, &buf, IndexEncoding::kDelta);
  ASSERT_NE(HeaderOf(buf).flags & kChunkDeltaIdx, 0);
  uint32_t len;
  std::memcpy(&len, buf.data() + sizeof(ChunkHeader), 4);
  EXPECT_EQ(len, 64u + 1 + 2 + 2 + 3 + 3 + 4 + 4 + 5 + 5 + 5);
  auto d = DecodeIndexChunk(buf.data(), buf.size(), 1, 1, n, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(std::vector<uint32_t>(d->idx, d->idx + d->header.count), idx);
  // A first index of 2^32 - 2 alone (one entry: the uint32 form is smaller).
  buf.clear();
  EncodeIndexChunk(1, 1, n, std::vector<uint32_t>{4294967294u}, nullptr, &buf,
                   IndexEncoding::kDelta);
  EXPECT_EQ(HeaderOf(buf).flags & kChunkDeltaIdx, 0);
  // Index 2^32 - 1 encodes (the encoder does not check the bucket) and is refused by the
  // decoder: no bucket has 2^32 elements.
  std::vector<uint32_t> last(idx.begin(), idx.begin() + 64);
  last.push_back(4294967295u);
  buf.clear();
  EncodeIndexChunk(1, 1, n, last, nullptr, &buf, IndexEncoding::kDelta);
  ASSERT_NE(HeaderOf(buf).flags & kChunkDeltaIdx, 0);
  auto bad = DecodeIndexChunk(buf.data(), buf.size(), 1, 1, n, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("index 4294967295 at position 64"), std::string::npos)
      << bad.status();
}

// The uint32 form where the delta form cannot be written or is not smaller: empty, one entry,
// not ascending, a repeated index, gaps too large, or --wire_index_encoding=u32. IndexSectionBytes
// predicts the choice; the chunk decodes the same either way.
TEST(WireDelta, FallsBackToUint32IndicesByItself) {
  struct Case {
    std::vector<uint32_t> idx;
    IndexEncoding enc;
    bool delta;
  };
  const std::vector<Case> cases = {
      {{}, IndexEncoding::kDelta, false},
      {{7}, IndexEncoding::kDelta, false},
      {{1, 2}, IndexEncoding::kDelta, false},  // 4 + 4 bytes is not smaller than 8
      {{1, 2, 3}, IndexEncoding::kDelta, true},
      {{1, 2, 3}, IndexEncoding::kU32, false},
      {{5, 3, 9, 10, 11, 12}, IndexEncoding::kDelta, false},  // not ascending
      {{1, 2, 2, 3, 4, 5}, IndexEncoding::kDelta, false},     // repeated
      {{1, 2, 3, 4, 5, 5}, IndexEncoding::kDelta, false},     // repeated at the end
      {{0, 1u << 29, 1u << 30, 1u << 31, 3u << 30}, IndexEncoding::kDelta, false},  // 21 bytes
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.idx.size() << " indices");
    std::vector<float> val(c.idx.size(), 1.5f);
    std::vector<uint8_t> a, b;
    EncodeIndexChunk(3, 4, 4294967295u, c.idx, nullptr, &a, c.enc);
    EncodeChunk(3, 4, 4294967295u, c.idx, val, DType::kFloat16, nullptr, &b, c.enc);
    EXPECT_EQ((HeaderOf(a).flags & kChunkDeltaIdx) != 0, c.delta);
    EXPECT_EQ((HeaderOf(b).flags & kChunkDeltaIdx) != 0, c.delta);
    EXPECT_EQ(IndexSectionBytes(c.idx, c.enc) < 4 * c.idx.size(), c.delta);
    EXPECT_EQ(a.size(), sizeof(ChunkHeader) + IndexSectionBytes(c.idx, c.enc));
    if (!c.delta) {
      EXPECT_EQ(a.size(), ChunkBytes(c.idx.size(), false, true));
      EXPECT_EQ(b.size(), ChunkBytes(c.idx.size(), true));
    }
    auto da = DecodeIndexChunk(a.data(), a.size(), 3, 4, 4294967295u, 0);
    auto db = DecodeChunk(b.data(), b.size(), 3, 4, 4294967295u, 0);
    ASSERT_TRUE(da.ok()) << da.status();
    ASSERT_TRUE(db.ok()) << db.status();
    EXPECT_EQ(std::vector<uint32_t>(da->idx, da->idx + da->header.count), c.idx);
    EXPECT_EQ(std::vector<uint32_t>(db->idx, db->idx + db->header.count), c.idx);
    EXPECT_EQ(db->values, val);
  }
}

// A delta chunk written by hand: `count` entries, the length word `len`, the section's bytes,
// padding bytes and anything after.
std::vector<uint8_t> HandMade(uint32_t count, uint32_t elements, uint32_t len,
                              const std::vector<uint8_t>& section, const std::vector<uint8_t>& pad,
                              const std::vector<uint8_t>& after = {},
                              uint16_t flags = kChunkIndexOnly | kChunkDeltaIdx) {
  ChunkHeader h{};
  h.magic = kChunkMagic;
  h.version = kChunkVersion;
  h.flags = flags;
  h.group_id = 5;
  h.step = 6;
  h.count = count;
  h.elements = elements;
  std::vector<uint8_t> b(sizeof(h));
  std::memcpy(b.data(), &h, sizeof(h));
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(len >> (8 * i)));
  b.insert(b.end(), section.begin(), section.end());
  b.insert(b.end(), pad.begin(), pad.end());
  b.insert(b.end(), after.begin(), after.end());
  return b;
}

// Every malformed delta section is an error naming the peer and what is wrong; nothing is read
// past the chunk (the ASan configuration checks that too).
TEST(WireDelta, MalformedDeltaSectionsAreRefused) {
  auto why = [](const std::vector<uint8_t>& b, uint32_t elements) {
    absl::Status s = DecodeIndexChunk(b.data(), b.size(), 5, 6, elements, 4).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("node 4"), std::string::npos) << s;
    return std::string(s.message());
  };
  auto has = [](const std::string& m, const char* what) {
    return m.find(what) != std::string::npos;
  };
  // The well-formed one these are cut from: {3, 4, 200} in a bucket of 1000.
  const std::vector<uint8_t> good = HandMade(3, 1000, 4, {3, 0, 0xc3, 0x01}, {});
  auto ok = DecodeIndexChunk(good.data(), good.size(), 5, 6, 1000, 4);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(std::vector<uint32_t>(ok->idx, ok->idx + 3), (std::vector<uint32_t>{3, 4, 200}));
  std::string m;
  // Too short for the length word.
  m = why(std::vector<uint8_t>(good.begin(), good.begin() + 50), 1000);
  EXPECT_TRUE(has(m, "before the delta index section's length")) << m;
  // A varint cut off by the section's end.
  m = why(HandMade(2, 1000, 2, {5, 0x85}, {0, 0}), 1000);
  EXPECT_TRUE(has(m, "varint of entry 1 is cut off")) << m;
  // The section ends before `count` entries.
  m = why(HandMade(3, 1000, 3, {1, 2, 0x81}, {0}), 1000);
  EXPECT_TRUE(has(m, "cut off")) << m;
  m = why(HandMade(5, 1000, 5, {1, 2, 3, 0x81, 0x01}, {0, 0, 0}), 1000);
  EXPECT_TRUE(has(m, "ends at entry 4 of 5")) << m;
  // Longer than 5 bytes.
  m = why(HandMade(2, 1000, 7, {0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, {0}), 1000);
  EXPECT_TRUE(has(m, "longer than 5 bytes")) << m;
  // Past 2^32 (5 bytes whose last one has more than 4 bits).
  m = why(HandMade(2, 4294967295u, 6, {0, 0xff, 0xff, 0xff, 0xff, 0x1f}, {0, 0}), 4294967295u);
  EXPECT_TRUE(has(m, "past 2^32")) << m;
  // Not minimal (a trailing zero group).
  m = why(HandMade(2, 1000, 3, {0, 0x81, 0x00}, {0}), 1000);
  EXPECT_TRUE(has(m, "not minimal")) << m;
  // An index outside the bucket, and one past 2^32 - 1 by the sum of gaps (never wrapped).
  m = why(HandMade(3, 1000, 4, {3, 0, 0xe3, 0x07}, {}), 1000);
  EXPECT_TRUE(has(m, "index 1000 at position 2 is outside the bucket")) << m;
  m = why(HandMade(2, 4294967295u, 6, {0xfe, 0xff, 0xff, 0xff, 0x0f, 0x05}, {0, 0}), 4294967295u);
  EXPECT_TRUE(has(m, "index 4294967300 at position 1")) << m;
  // The length word says more than the count's varints take (trailing section bytes).
  m = why(HandMade(2, 1000, 3, {1, 2, 3}, {0}), 1000);
  EXPECT_TRUE(has(m, "says 3 bytes, but its 2 entries take 2")) << m;
  // A count no section of that length can hold (refused before anything is allocated).
  m = why(HandMade(900, 1000, 4, {1, 2, 3, 4}, {}), 1000);
  EXPECT_TRUE(has(m, "cannot fit")) << m;
  // Nonzero padding.
  m = why(HandMade(3, 1000, 3, {1, 2, 3}, {7}), 1000);
  EXPECT_TRUE(has(m, "nonzero padding")) << m;
  // Missing padding, a length word past the bytes, trailing bytes after the chunk.
  m = why(HandMade(3, 1000, 3, {1, 2, 3}, {}), 1000);
  EXPECT_TRUE(has(m, "need 56")) << m;
  m = why(HandMade(3, 1000, 4000000000u, {1, 2, 3}, {0}), 1000);
  EXPECT_TRUE(has(m, "section of 4000000000 bytes")) << m;
  m = why(HandMade(3, 1000, 4, {3, 0, 0xc3, 0x01}, {}, {0}), 1000);
  EXPECT_TRUE(has(m, "57 bytes")) << m;
  m = why(HandMade(3, 1000, 4, {3, 0, 0xc3, 0x01}, {}, {0, 0, 0, 0}), 1000);
  EXPECT_TRUE(has(m, "60 bytes")) << m;
  // With values: the value section must follow the padding exactly.
  const std::vector<uint8_t> f32(12, 0);
  auto v = HandMade(3, 1000, 4, {3, 0, 0xc3, 0x01}, {}, f32, kChunkDeltaIdx);
  auto dv = DecodeChunk(v.data(), v.size(), 5, 6, 1000, 4);
  ASSERT_TRUE(dv.ok()) << dv.status();
  EXPECT_EQ(dv->values, std::vector<float>(3, 0.0f));
  v.pop_back();
  EXPECT_FALSE(DecodeChunk(v.data(), v.size(), 5, 6, 1000, 4).ok());
}

// ChunkLength finds the chunks of a concatenation (the fused exchange's messages) in either form.
TEST(WireDelta, ChunkLengthSplitsAConcatenation) {
  const std::vector<uint32_t> a = AscendingSet(5000, 0.1, 1), b = {9, 3, 1};
  const std::vector<float> va(a.size(), 1.0f), vb(b.size(), 2.0f);
  std::vector<uint8_t> all;
  std::vector<size_t> ends;
  EncodeIndexChunk(1, 1, 5000, a, nullptr, &all, IndexEncoding::kDelta);
  ends.push_back(all.size());
  EncodeChunk(2, 1, 5000, a, va, DType::kFloat16, nullptr, &all, IndexEncoding::kDelta);
  ends.push_back(all.size());
  EncodeChunk(3, 1, 5000, b, vb, DType::kBFloat16, nullptr, &all,
              IndexEncoding::kDelta);  // uint32: not ascending
  ends.push_back(all.size());
  EncodeChunk(4, 1, 5000, a, va, DType::kFloat32, nullptr, &all, IndexEncoding::kU32);
  ends.push_back(all.size());
  size_t off = 0;
  for (size_t end : ends) {
    const size_t len = ChunkLength(all.data() + off, all.size() - off);
    EXPECT_EQ(off + len, end);
    off += len;
  }
  // Less than a header or a length word: more than is there.
  EXPECT_GT(ChunkLength(all.data(), 47), 47u);
  EXPECT_GT(ChunkLength(all.data(), 50), 50u);
}

TEST(WireDelta, FlagParses) {
  IndexEncoding e = IndexEncoding::kU32;
  std::string err;
  EXPECT_TRUE(AbslParseFlag("delta", &e, &err));
  EXPECT_EQ(e, IndexEncoding::kDelta);
  EXPECT_TRUE(AbslParseFlag("u32", &e, &err));
  EXPECT_EQ(e, IndexEncoding::kU32);
  EXPECT_FALSE(AbslParseFlag("varint", &e, &err));
  EXPECT_NE(err.find("delta or u32"), std::string::npos);
  EXPECT_EQ(AbslUnparseFlag(IndexEncoding::kDelta), "delta");
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The exchanges over in-process nodes give the same union, counts and outputs, bit for bit, with
// the indices in the delta form and as uint32 (patterns A and B, Ok-Topk with float32 and
// float16 values), and the delta form sends fewer bytes. Node 2 sends its selection unsorted:
// its chunks fall back to uint32 by themselves while the others' are delta.
TEST(WireDelta, ExchangesAreBitIdenticalWithEitherIndexForm) {
  for (int nodes : {1, 2, 3, 4}) {
    test::Spawn(nodes, [&](Collective* coll) {
      SCOPED_TRACE(testing::Message() << nodes << " nodes, rank " << coll->rank());
      auto prims = MakeCpuPrimitives(1);
      const uint32_t n = 20000;
      const int r = coll->rank();
      std::vector<uint32_t> idx = AscendingSet(n, 0.05 + 0.02 * r, 100 + r);
      std::vector<float> val(idx.size());
      for (size_t j = 0; j < idx.size(); ++j) val[j] = std::sin(0.37f * (j + 1) * (r + 1));
      if (r == 2) {
        std::reverse(idx.begin(), idx.end());
        std::reverse(val.begin(), val.end());
      }
      std::vector<float> acc(n);
      for (uint32_t i = 0; i < n; ++i) acc[i] = std::cos(0.11f * i + r);
      for (int pattern = 0; pattern < 4; ++pattern) {  // A, B, Ok-Topk, Ok-Topk float16
        SCOPED_TRACE(testing::Message() << "pattern " << pattern);
        SparseExchangeResult res[2];
        std::vector<float> out[2] = {std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
        for (int e = 0; e < 2; ++e) {
          SparseExchangeArgs args;
          args.group_id = 11;
          args.step = 2;
          args.elements = n;
          args.scale = 1.0f / static_cast<float>(2 * coll->size());
          args.fp16 = pattern == 3;
          args.index_encoding = e == 0 ? IndexEncoding::kU32 : IndexEncoding::kDelta;
          absl::Status s;
          if (pattern == 0) {
            s = ExchangeIndexUnion(coll, prims.get(), args, idx, acc.data(), out[e].data(),
                                   &res[e]);
          } else if (pattern == 1) {
            s = ExchangeSparseGather(coll, prims.get(), args, idx, val, out[e].data(), &res[e]);
          } else {
            s = ExchangeOkTopk(coll, prims.get(), args, {}, idx, val, out[e].data(), &res[e]);
          }
          ASSERT_TRUE(s.ok()) << s;
        }
        EXPECT_TRUE(SameBits(out[0], out[1]));
        EXPECT_EQ(res[0].gathered_idx, res[1].gathered_idx);
        EXPECT_EQ(res[0].counts, res[1].counts);
        EXPECT_EQ(res[0].touched, res[1].touched);
        if (pattern < 2) {
          if (r != 2) {
            EXPECT_LT(res[1].bytes_sent, res[0].bytes_sent);
          } else {
            EXPECT_EQ(res[1].bytes_sent, res[0].bytes_sent);
          }
          if (coll->size() > 1) {
            EXPECT_LT(res[1].bytes_received, res[0].bytes_received);
          }
        }
      }
    });
  }
}

// ReplaceAt is ZeroAt(prev) then a write at u, whatever the sets: across its blocks' edges, at the
// bucket's last element, prev and u overlapping, either one empty. Fails if a block's end drops
// an index, or a zero lands after a write at the same position.
TEST(FusedUnion, ReplaceAtIsZeroThenWrite) {
  const uint32_t n = 3 * 32768 + 5;
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    std::vector<uint32_t> prev =
        round == 4 ? std::vector<uint32_t>{} : AscendingSet(n, 0.1, 3 + round);
    std::vector<uint32_t> u =
        round == 5 ? std::vector<uint32_t>{} : AscendingSet(n, 0.07, 40 + round);
    if (round == 1) u = prev;            // the same union again
    if (round == 2) u.push_back(n - 1);  // the last element
    if (round == 3) prev.insert(prev.begin(), 0);
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
    std::vector<float> val(u.size());
    for (size_t j = 0; j < u.size(); ++j) val[j] = 1.0f + static_cast<float>(j);
    std::vector<float> out(n, 0.0f);
    for (uint32_t i : prev) out[i] = -7.0f;
    std::vector<float> want = out;
    for (uint32_t i : prev) want[i] = 0.0f;
    for (size_t j = 0; j < u.size(); ++j) want[u[j]] = val[j];
    ReplaceAt(out.data(), n, prev, u.data(), val.data(), u.size());
    EXPECT_TRUE(SameBits(out, want));
  }
}

// Pattern A's fused passes (SparseExchangeArgs::keep_rounding, out_nonzero) against the separate
// ones, bit for bit, on 1 to 4 nodes with float16 values: the same output (out held last step's
// values, zeroed by the exchange) and the same residual as KeepRounding after the plain exchange.
// On one node nothing goes out rounded. Where one value overflows float16, the values go as
// float32: the fused exchange must hand acc back as it was (residual_kept false), so the caller
// zeroes it as before.
TEST(FusedUnion, FusedPassesMatchTheSeparateOnes) {
  for (int nodes : {1, 2, 3, 4}) {
    for (bool overflow : {false, true}) {
      test::Spawn(nodes, [&](Collective* coll) {
        SCOPED_TRACE(testing::Message()
                     << nodes << " nodes, rank " << coll->rank() << (overflow ? ", overflow" : ""));
        auto prims = MakeCpuPrimitives(1);
        const uint32_t n = 70001;
        const int r = coll->rank();
        const std::vector<uint32_t> idx = AscendingSet(n, 0.03 + 0.01 * r, 7 + r);
        const std::vector<uint32_t> prev = AscendingSet(n, 0.05, 99);
        std::vector<float> acc0(n);
        for (uint32_t i = 0; i < n; ++i) acc0[i] = 3.0f * std::sin(0.013f * i + r);
        if (overflow && r == 0)
          acc0[AscendingSet(n, 0.03 + 0.01 * (nodes - 1), 7 + nodes - 1)[3]] = 9e4f;
        SparseExchangeArgs args;
        args.group_id = 5;
        args.step = 9;
        args.elements = n;
        args.scale = 1.0f / static_cast<float>(2 * coll->size());
        args.wire = DType::kFloat16;
        // The separate passes: out zeroed first, acc read, then the residual kept.
        std::vector<float> acc_a = acc0, out_a(n, 0.0f);
        SparseExchangeResult ra;
        ASSERT_TRUE(
            ExchangeIndexUnion(coll, prims.get(), args, idx, acc_a.data(), out_a.data(), &ra).ok());
        if (IsHalf(ra.values_sent)) {
          half::KeepRounding(ra.values_sent, acc_a.data(), ra.gathered_idx.data(), nullptr,
                             ra.gathered_idx.size());
        }
        // The fused ones: out still holds last step's values at prev.
        std::vector<float> acc_b = acc0, out_b(n, 0.0f);
        for (uint32_t i : prev) out_b[i] = 5.0f;
        args.keep_rounding = true;
        args.out_nonzero = &prev;
        SparseExchangeResult rb;
        ASSERT_TRUE(
            ExchangeIndexUnion(coll, prims.get(), args, idx, acc_b.data(), out_b.data(), &rb).ok());
        EXPECT_TRUE(rb.out_replaced);
        EXPECT_EQ(rb.values_sent, ra.values_sent);
        EXPECT_EQ(rb.residual_kept, !overflow && nodes > 1);  // one node: nothing rounded
        EXPECT_EQ(rb.gathered_idx, ra.gathered_idx);
        EXPECT_TRUE(SameBits(out_a, out_b));
        EXPECT_TRUE(SameBits(overflow ? acc0 : acc_a, acc_b));
      });
    }
  }
}

// The half all-reduce on 1 to 5 nodes, every node's result against the oracle (each node's
// values rounded to float16, summed in float32 in rank order, scaled, rounded once), bit for
// bit, with n not a multiple of the nodes; on two nodes one all-gather, the same bytes as the
// all-to-all and all-gather elsewhere: 2 (N - 1) ceil(n / N) x 2 each way.
TEST(HalfAllReduce, EveryNodeCountGivesTheOracleBits) {
  for (int nodes : {1, 2, 3, 4, 5}) {
    test::Spawn(nodes, [&](Collective* coll) {
      SCOPED_TRACE(testing::Message() << nodes << " nodes, rank " << coll->rank());
      const size_t n = 10007;
      std::vector<std::vector<float>> in(nodes, std::vector<float>(n));
      for (int r = 0; r < nodes; ++r) {
        for (size_t i = 0; i < n; ++i) in[r][i] = 40.0f * std::sin(0.7f * i + 1.3f * r);
      }
      const float scale = 1.0f / static_cast<float>(2 * nodes);
      std::vector<float> want(n);
      for (size_t i = 0; i < n; ++i) {
        float sum = 0.0f;
        for (int r = 0; r < nodes; ++r) {
          sum += HalfToFloat(DType::kFloat16, FloatToHalf(DType::kFloat16, in[r][i]));
        }
        want[i] = HalfToFloat(DType::kFloat16, FloatToHalf(DType::kFloat16, sum * scale));
      }
      const std::vector<float>& mine = in[coll->rank()];
      std::vector<float> got(n);
      HalfAllReduceBytes bytes;
      ASSERT_TRUE(
          HalfAllReduceScaled(coll, DType::kFloat16, mine.data(), got.data(), n, scale, &bytes)
              .ok());
      EXPECT_TRUE(SameBits(got, want));
      const uint64_t c = (n + nodes - 1) / nodes;
      EXPECT_EQ(bytes.sent, nodes == 1 ? 0u : 2u * (nodes - 1) * c * 2);
    });
  }
}

// SortedUnion against sort + unique of the concatenation: disjoint runs in any rank order (the
// one-copy path), interleaved and overlapping runs, empty runs, a run with a repeat, a run out of
// order, one run. Fails if the one-copy path takes runs that overlap or repeat.
TEST(SortedUnionTest, IsSortAndUniqueOfTheRuns) {
  std::mt19937 rng(21);
  const std::vector<std::vector<std::vector<uint32_t>>> cases = {
      {{200, 300, 400}, {1, 2, 3}, {}, {500, 600}},  // disjoint, out of rank order
      {{1, 5, 9}, {2, 6, 10}},                       // interleaved
      {{1, 5, 9}, {9, 12}},                          // touching: 9 in both
      {{1, 5, 9}, {3, 4}},                           // inside another's span
      {{1, 2, 2, 7}, {10, 11}},                      // a repeat within a run
      {{7, 3, 1}, {10, 11}},                         // a run out of order
      {{4, 8, 15}},                                  // one run
      {{}, {}},                                      // nothing
  };
  for (size_t c = 0; c < cases.size() + 20; ++c) {
    std::vector<std::vector<uint32_t>> runs;
    if (c < cases.size()) {
      runs = cases[c];
    } else {  // random: disjoint ranges half the time, else random sets
      const int nodes = 2 + static_cast<int>(c % 4);
      for (int r = 0; r < nodes; ++r) {
        std::vector<uint32_t> run;
        for (uint32_t i = 0; i < 5000; ++i) {
          if (rng() % 7 == 0) run.push_back(c % 2 ? r * 5000 + i : i);
        }
        runs.push_back(run);
      }
      std::shuffle(runs.begin(), runs.end(), rng);
    }
    std::vector<uint32_t> v, out, scratch;
    std::vector<size_t> off(1, 0);
    for (const auto& r : runs) {
      v.insert(v.end(), r.begin(), r.end());
      off.push_back(v.size());
    }
    std::vector<uint32_t> want = v;
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    SortedUnion(v, off, &out, &scratch);
    EXPECT_EQ(out, want) << "case " << c;
  }
}

}  // namespace
}  // namespace spex
