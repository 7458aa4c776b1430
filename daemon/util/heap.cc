// ReleaseFreeHeap (heap.h): gives an idle daemon's free heap pages back to the kernel, one
// malloc_trim at a time.
#include "daemon/util/heap.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace spex {

int64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

int64_t ReleaseFreeHeap() {
#if defined(__GLIBC__)
  // One call at a time. glibc initialises its allocator lazily, and malloc_trim does so itself
  // when nothing has used glibc's malloc yet (as under ThreadSanitizer, which replaces malloc):
  // two first calls at once (in-process nodes falling idle together) both attach their thread to
  // the main arena, and the second thread's exit then fails glibc's assertion
  // "a->attached_threads > 0" (seen once in merge_engine_test under TSan).
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const int64_t before = ResidentBytes();
  malloc_trim(0);
  const int64_t after = ResidentBytes();
  return before > after ? before - after : 0;
#else
  return 0;
#endif
}

bool UseOneMallocArena() {
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr) return false;
  return mallopt(M_ARENA_MAX, 1) == 1;
#else
  return false;
#endif
}

bool KeepLargeBlocksInHeap() {
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_MMAP_MAX_") != nullptr ||
      std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) {
    return false;
  }
  const bool mmap_off = mallopt(M_MMAP_MAX, 0) == 1;
  const bool trim_off = mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max()) == 1;  // 2 GiB
  return mmap_off && trim_off;
#else
  return false;
#endif
}

}  // namespace spex
