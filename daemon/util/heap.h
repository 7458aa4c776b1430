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

// This process's resident size in bytes, from /proc/self/statm; 0 where it cannot be read.
int64_t ResidentBytes();

// Makes every thread allocate from glibc's one main arena (mallopt M_ARENA_MAX = 1) unless the
// environment already sets MALLOC_ARENA_MAX. spexd's per-job objects are allocated by whichever
// gRPC thread handles the request, so with one arena per thread each job's leftovers pin pages
// in a different arena and the resident size creeps up job after job (50 short jobs: +708 KiB
// of anonymous memory over 50 jobs with per-thread arenas, +172 KiB with one). What the shared
// arena's lock costs the step was not measured. Returns whether it set the limit.
bool UseOneMallocArena();

// Keeps large freed blocks in the heap instead of handing each back to the kernel on free()
// (mallopt M_MMAP_MAX = 0: no block gets a mapping of its own; M_TRIM_THRESHOLD = 2 GiB: free()
// does not trim the heap's top), unless the environment sets MALLOC_MMAP_MAX_ or
// MALLOC_TRIM_THRESHOLD_. Open MPI's ring all-reduce mallocs and frees segment buffers of half a
// bucket in every call; by default glibc maps each of them on its own and unmaps it on free, so
// every dense exchange of a 100 MB bucket faulted in 25,000+ fresh pages, and the unmapping also
// slowed the next pass over the buckets' own memory (on these VMs' shadow paging: the sparse
// bucket's local reduce after a dense exchange took 26.5 ms instead of 10-12 ms, and the dense
// exchange itself 1,095 ms instead of 885 ms; bench/network_bench.py, 2 hosts at 1 Gbit/s).
// Memory a job freed is still returned once the job has gone (ReleaseFreeHeap). Returns whether
// it set both limits.
bool KeepLargeBlocksInHeap();

}  // namespace spex

#endif  // SPEX_DAEMON_UTIL_HEAP_H_
