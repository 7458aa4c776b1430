// Returning the heap's free pages to the kernel when a daemon falls idle.
#ifndef SPEX_DAEMON_UTIL_HEAP_H_
#define SPEX_DAEMON_UTIL_HEAP_H_

#include <cstdint>

namespace spex {

// Hands the pages of free heap memory back to the kernel (glibc's malloc_trim(0): the top of
// every arena and the free chunks inside them) and returns how many bytes of resident memory
// that released (0 where the C library has no malloc_trim). Called when the last session of a
// job has gone: a job's requests, gRPC's buffers and the engine's per-step scratch leave free
// chunks spread over glibc's per-thread arenas, which otherwise stay resident and grow the
// daemon's resident size a little with every job (bench/soak.py measured it).
int64_t ReleaseFreeHeap();

// Makes every thread allocate from glibc's one main arena (mallopt M_ARENA_MAX = 1) unless the
// environment already sets MALLOC_ARENA_MAX. spexd's per-job objects are allocated by whichever
// gRPC thread handles the request, so with one arena per thread each job's leftovers pin pages
// in a different arena and the resident size creeps up job after job (50 short jobs: +708 KiB
// of anonymous memory over 50 jobs with per-thread arenas, +172 KiB with one). What the shared
// arena's lock costs the step was not measured. Returns whether it set the limit.
bool UseOneMallocArena();

}  // namespace spex

#endif  // SPEX_DAEMON_UTIL_HEAP_H_
