// ReleaseFreeHeap (daemon/util/heap.h): what spexd calls when a job's last trainer has gone.
#include "daemon/util/heap.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace spex {
namespace {

TEST(ReleaseFreeHeap, HandsFreedChunksInsideTheHeapBackToTheKernel) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocators keep their own free lists; malloc_trim is glibc's";
#else
  // 1,000 blocks of 64 KiB (below glibc's mmap threshold, so on the heap), each touched; then
  // every block but the last is freed. The last one pins the heap's top, so free() itself cannot
  // give the 62.5 MiB below it back: only a trim of the chunks inside the heap can.
  constexpr size_t kBlock = 64 << 10, kBlocks = 1000;
  std::vector<char*> blocks;
  for (size_t i = 0; i < kBlocks; ++i) {
    char* p = static_cast<char*>(std::malloc(kBlock));
    ASSERT_NE(p, nullptr);
    std::memset(p, static_cast<int>(i), kBlock);
    blocks.push_back(p);
  }
  for (size_t i = 0; i + 1 < kBlocks; ++i) std::free(blocks[i]);
  const int64_t released = ReleaseFreeHeap();
  std::free(blocks.back());
  EXPECT_GE(released, static_cast<int64_t>(kBlock * (kBlocks - 1) / 2))
      << "released " << released << " bytes of " << kBlock * (kBlocks - 1) << " freed";
#endif
}

// mallopt is process-wide: this test sets the limits and checks their effect on a 64 MiB block
// (above glibc's largest mmap threshold, so by default mapped on its own and unmapped by free()).
// It runs after the test above, which relies on glibc's defaults only for 64 KiB blocks.
TEST(KeepLargeBlocksInHeap, FreeKeepsALargeBlockResidentForTheNextAllocation) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocators ignore glibc's mallopt";
#else
  if (std::getenv("MALLOC_MMAP_MAX_") != nullptr ||
      std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) {
    GTEST_SKIP() << "the environment sets glibc's limits itself";
  }
  ASSERT_TRUE(KeepLargeBlocksInHeap());
  constexpr size_t kBytes = 64 << 20;
  char* p = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, kBytes);
  const int64_t touched = ResidentBytes();
  std::free(p);
  const int64_t after_free = ResidentBytes();
  // Unmapped by free(), the block would take 64 MiB of resident memory with it.
  EXPECT_GT(after_free, touched - static_cast<int64_t>(kBytes / 2))
      << "free() returned the block to the kernel: resident " << touched << " -> " << after_free;
  char* q = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(q, nullptr);
  std::memset(q, 2, kBytes);
  EXPECT_LT(ResidentBytes(), touched + static_cast<int64_t>(kBytes / 2))
      << "the second block was not the first one's memory";
  std::free(q);
  // What a job freed still goes back when the job has gone.
  EXPECT_GE(ReleaseFreeHeap(), static_cast<int64_t>(kBytes / 2));
#endif
}

}  // namespace
}  // namespace spex
