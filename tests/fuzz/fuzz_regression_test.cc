// Inputs the fuzz targets of tests/fuzz found crashing, as unit tests (they run in the default
// build and under --config=asan, where the undefined behaviour they hit is fatal).
#include <cstdint>
#include <cstring>
#include <vector>

#include "daemon/engine/wire.h"
#include "gtest/gtest.h"

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

}  // namespace
}  // namespace spex
