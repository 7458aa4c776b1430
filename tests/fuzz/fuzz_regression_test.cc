// Inputs the fuzz targets of tests/fuzz found crashing, as unit tests (they run in the default
// build and under --config=asan, where the undefined behaviour they hit is fatal).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "daemon/engine/wire.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/reference/reference_primitives.h"
#include "proto/contract/layout.h"

namespace spex {
namespace {

// wire_fuzz, regressions/wire_fuzz/empty_index_chunk: an index-only chunk with count 0 (what a
// node that selected nothing sends in pattern A). Encoding and decoding an empty chunk passed a
// null pointer to memcpy (an empty vector's data()), undefined behaviour caught by UBSan.
TEST(WireFuzzRegression, EmptyChunksEncodeAndDecode) {
  const float scalars[4] = {1, 2, 3, 4};
  const std::vector<uint32_t> no_idx;
  const std::vector<float> no_val;
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<uint8_t> out;
    if (kind == 2) {
      EncodeIndexChunk(7, 3, 1000, no_idx, scalars, &out);
    } else {
      EncodeChunk(7, 3, 1000, no_idx, no_val, /*fp16=*/kind == 1, scalars, &out);
    }
    ASSERT_EQ(out.size(), sizeof(ChunkHeader));
    auto d = kind == 2 ? DecodeIndexChunk(out.data(), out.size(), 7, 3, 1000, 1)
                       : DecodeChunk(out.data(), out.size(), 7, 3, 1000, 1);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->header.count, 0u);
    EXPECT_TRUE(d->values.empty());
    EXPECT_EQ(d->header.scalars[3], 4.0f);
  }
}

// The crashing input itself: an index-only chunk header for bucket 0, step 0, count 0 and
// elements 0, with scalar bytes; decoding it against its own header succeeds and re-encoding
// gives the same 48 bytes.
TEST(WireFuzzRegression, EmptyIndexChunkInput) {
  std::vector<uint8_t> in = {'S', 'P', 'X', 'C', 1, 0, 2, 0};
  in.resize(43, 0);
  for (uint8_t b : {0xff, 0xff, 0xff, 0xff, 0x0a}) in.push_back(b);
  ASSERT_EQ(in.size(), 48u);
  EXPECT_FALSE(DecodeChunk(in.data(), in.size(), 0, 0, 0, 1).ok());  // index-only: refused here
  auto d = DecodeIndexChunk(in.data(), in.size(), 0, 0, 0, 1);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<uint8_t> again;
  EncodeIndexChunk(0, 0, 0, {}, d->header.scalars, &again);
  EXPECT_EQ(again, in);
}

// wire_fuzz, the delta index form (kChunkDeltaIdx): a 52-byte chunk claiming 2^32 - 16 entries
// in a 4-byte section must be refused before the decoder sizes its index copy by the count (16
// GiB from a peer's few bytes); so must a length word past the bytes (ChunkLength's sum must not
// wrap) and one that is all ones.
TEST(WireFuzzRegression, DeltaChunkCountsAndLengthsAreCheckedBeforeUse) {
  auto chunk = [](uint32_t count, uint32_t len, size_t section_bytes) {
    ChunkHeader h{};
    h.magic = kChunkMagic;
    h.version = kChunkVersion;
    h.flags = kChunkIndexOnly | kChunkDeltaIdx;
    h.count = count;
    h.elements = 0xffffffffu;
    std::vector<uint8_t> b(sizeof(h) + 4 + section_bytes, 0);
    std::memcpy(b.data(), &h, sizeof(h));
    std::memcpy(b.data() + sizeof(h), &len, 4);
    return b;
  };
  auto huge = chunk(0xfffffff0u, 4, 4);
  auto d = DecodeIndexChunk(huge.data(), huge.size(), 0, 0, 0xffffffffu, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("cannot fit"), std::string::npos) << d.status();
  for (uint32_t len : {8u, 0xfffffffcu, 0xffffffffu}) {
    auto b = chunk(2, len, 4);
    EXPECT_GT(ChunkLength(b.data(), b.size()), b.size()) << len;
    EXPECT_FALSE(DecodeIndexChunk(b.data(), b.size(), 0, 0, 0xffffffffu, 1).ok()) << len;
  }
}

// compressor_fuzz, regressions/compressor_fuzz/deft_nan: an infinite gradient makes a unit's
// norm infinite, and DEFT's share of k for it inf/inf = NaN, which was cast to size_t
// (undefined; in practice a huge k). Now such a unit gets at least one entry, as a zero norm does.
TEST(CompressorFuzzRegression, DeftWithInfiniteGradient) {
  auto prims = MakeReferencePrimitives();
  CompressorSpec spec;
  spec.name = "deft";
  spec.density = 0.1;
  spec.elements = 64;
  auto c = MakeCompressor(spec, prims.get());
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> acc(64, 0.5f);
  acc[3] = INFINITY;
  acc[40] = -INFINITY;
  Selection sel;
  ASSERT_TRUE((*c)->Select(0, acc.data(), nullptr, false, &sel).ok());
  for (size_t i = 0; i < sel.idx.size(); ++i) {
    ASSERT_LT(sel.idx[i], 64u);
    if (i) {
      EXPECT_GT(sel.idx[i], sel.idx[i - 1]);
    }
  }
}

// compressor_fuzz, regressions/compressor_fuzz/exdyna_overflow: Update took per-node counts
// larger than the bucket (a peer's claim), and ExDyna's block allocation converted
// count / n * block size out of int64 range. Update now refuses a count above the bucket size.
TEST(CompressorFuzzRegression, UpdateRefusesCountAboveBucketSize) {
  auto prims = MakeReferencePrimitives();
  for (const char* name : {"exdyna", "topk", "micro"}) {
    CompressorSpec spec;
    spec.name = name;
    spec.density = 0.05;
    spec.node_count = 2;
    spec.elements = 1000;
    auto c = MakeCompressor(spec, prims.get());
    ASSERT_TRUE(c.ok()) << c.status();
    std::vector<float> acc(1000, 1.0f);
    Selection sel;
    ASSERT_TRUE((*c)->Select(0, acc.data(), nullptr, false, &sel).ok());
    const std::vector<uint64_t> counts = {sel.idx.size(), uint64_t{1} << 63};
    Gathered g{counts, sel.idx};
    absl::Status s = (*c)->Update(0, g);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name << ": " << s;
  }
}

// header_fuzz, regressions/header_fuzz/misaligned_header: a RegisterBucket reply whose header
// offset is not a multiple of the BucketHeader's alignment (64) was accepted, and the client
// then used its atomics (futex words) at a misaligned address. Now refused, as are float slots
// at offsets that are not multiples of 4.
TEST(HeaderFuzzRegression, MisalignedOffsetsRefused) {
  const size_t elements = 100;
  const uint32_t slots = 1;
  const size_t size = BucketBytes(elements, slots) + 4096;
  std::unique_ptr<uint8_t[]> raw(new uint8_t[size + 64]);
  uint8_t* base = raw.get() + (64 - reinterpret_cast<uintptr_t>(raw.get()) % 64) % 64;
  std::memset(base, 0, size);
  auto reply = [&](uint64_t header, uint64_t input, uint64_t output) {
    v1::RegisterBucketResponse r;
    r.mutable_layout()->set_header_offset(header);
    r.mutable_layout()->set_input_offset(input);
    r.mutable_layout()->set_output_offset(output);
    r.mutable_layout()->set_elements(elements);
    // Written bytewise: at a misaligned offset the struct must not be used here either.
    const uint32_t magic = kBucketMagic;
    const uint64_t n = elements;
    std::memcpy(base + header + offsetof(BucketHeader, magic), &magic, 4);
    std::memcpy(base + header + offsetof(BucketHeader, elements), &n, 8);
    std::memcpy(base + header + offsetof(BucketHeader, slots), &slots, 4);
    return r;
  };
  const uint64_t in = InputOffset(elements, 0), out = OutputOffset(elements, slots);
  auto ok = ResolveBucketView(reply(0, in, out), elements, 0, slots, base, size, false, nullptr);
  ASSERT_TRUE(ok.ok()) << ok.status();
  std::memset(base, 0, size);
  EXPECT_FALSE(
      ResolveBucketView(reply(13, in, out), elements, 0, slots, base, size, false, nullptr).ok());
  std::memset(base, 0, size);
  EXPECT_FALSE(
      ResolveBucketView(reply(0, in + 2, out), elements, 0, slots, base, size, false, nullptr)
          .ok());
  EXPECT_FALSE(
      ResolveBucketView(reply(0, in, out + 1), elements, 0, slots, base, size, false, nullptr)
          .ok());
}

}  // namespace
}  // namespace spex
