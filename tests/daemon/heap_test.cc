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

}  // namespace
}  // namespace spex
