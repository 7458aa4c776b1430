#include "daemon/engine/wire.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace spex {
namespace {

TEST(Wire, RoundTripFp32AndFp16) {
  std::vector<uint32_t> idx = {0, 5, 99};
  std::vector<float> val = {1.5f, -2.25f, 65504.0f};
  for (bool fp16 : {false, true}) {
    std::vector<uint8_t> buf;
    EncodeChunk(7, 3, 100, idx, val, fp16, nullptr, &buf);
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
    EncodeChunk(7, 3, 10, idx, val, c.t, scalars, &buf);
    EXPECT_EQ(buf.size(), ChunkBytes(3, false));
    auto d = DecodeChunk(buf.data(), buf.size(), 7, 3, 10, 0);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->header.flags, 0);
    EXPECT_EQ(d->values, val);
  }
  // The bool form (--fp16_values) too; and 65,504 (float16's largest) fits.
  std::vector<uint8_t> buf;
  EncodeChunk(7, 3, 10, idx, std::vector<float>{1.0f, -70000.0f, 2.0f}, /*fp16=*/true, scalars,
              &buf);
  EXPECT_EQ(buf.size(), ChunkBytes(3, false));
  const std::vector<float> fits = {0.5f, 65504.0f, -65519.0f};
  EXPECT_EQ(ValuesWire(DType::kFloat16, fits), DType::kFloat16);
  buf.clear();
  EncodeChunk(7, 3, 10, idx, fits, DType::kFloat16, scalars, &buf);
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
  EncodeChunk(7, 3, 10, idx, val, true, nullptr, &chunk);
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
    EncodeChunk(9, 1, idx.size(), idx, val, t, nullptr, &buf);
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
  EncodeChunk(1, 0, 10, idx, val, false, nullptr, &good);
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
  EncodeIndexChunk(5, 2, 10, idx, nullptr, &chunk);
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
  EncodeChunk(5, 2, 10, idx, val, false, nullptr, &with_values);
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
  EncodeChunk(7, 3, 100, idx, val, DType::kBFloat16, nullptr, &buf);
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
  EncodeIndexChunk(7, 3, 100, idx, nullptr, &ix);
  std::memcpy(&h, ix.data(), sizeof(h));
  h.flags |= kChunkBf16;
  std::memcpy(ix.data(), &h, sizeof(h));
  auto half_ix = DecodeIndexChunk(ix.data(), ix.size(), 7, 3, 100, 1);
  ASSERT_FALSE(half_ix.ok());
  EXPECT_NE(half_ix.status().message().find("index-only"), std::string::npos);
}

}  // namespace
}  // namespace spex
