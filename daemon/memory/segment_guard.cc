// The SIGBUS guard of shared segments (segment_guard.h): the slot table and the handler.
#include "daemon/memory/segment_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <mutex>

#include "daemon/util/log.h"

namespace spex {
namespace {

// Buckets of every session plus the doorbell; a full table leaves new ranges unguarded.
constexpr int kSlots = 1 << 16;

struct Slot {
  std::atomic<uintptr_t> base{0};  // 0: free
  std::atomic<size_t> size{0};
  std::atomic<bool> pulled{false};
};

Slot g_slots[kSlots];
std::atomic<int> g_high{0};  // slots at and above this are free
std::atomic<int> g_repairs{0};
struct sigaction g_previous;
std::once_flag g_installed;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  const int high = g_high.load(std::memory_order_acquire);
  for (int i = 0; i < high; ++i) {
    const uintptr_t base = g_slots[i].base.load(std::memory_order_acquire);
    const size_t size = g_slots[i].size.load(std::memory_order_acquire);
    if (base == 0 || addr < base || addr >= base + size) continue;
    // Zero pages of our own from the faulting page to the end of the range: every later access
    // there succeeds, and what the file still holds (the header before the cut) stays shared.
    // A later cut further down faults again and is repaired the same way. mmap is a plain
    // system call, safe here.
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t from = addr & ~(page - 1);
    void* p = mmap(reinterpret_cast<void*>(from), base + size - from, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) break;
    if (!g_slots[i].pulled.exchange(true)) g_repairs.fetch_add(1);
    static const char kMsg[] =
        "spexd: a shared segment was shrunk under the daemon (SIGBUS); its bucket fails\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    return;
  }
  // Not ours: what was there before (the default: the process dies with SIGBUS).
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    signal(SIGBUS, SIG_DFL);  // returning re-runs the access, which now ends the process
  }
}

void Install() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = OnSigbus;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

SegmentGuard::SegmentGuard(void* base, size_t size) {
  std::call_once(g_installed, Install);
  for (int i = 0; i < kSlots; ++i) {
    uintptr_t expected = 0;
    if (g_slots[i].base.load(std::memory_order_relaxed) != 0) continue;
    // Claim the slot with a placeholder, fill it, then publish the real base.
    if (!g_slots[i].base.compare_exchange_strong(expected, 1)) continue;
    g_slots[i].size.store(size, std::memory_order_release);
    g_slots[i].pulled.store(false, std::memory_order_release);
    g_slots[i].base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    int high = g_high.load();
    while (high < i + 1 && !g_high.compare_exchange_weak(high, i + 1)) {
    }
    slot_ = i;
    flag_ = &g_slots[i].pulled;
    return;
  }
  SPEX_LOG(WARNING) << "segment guard table full: a shared segment of " << size
                    << " bytes is not guarded against shrinking";
}

SegmentGuard::~SegmentGuard() {
  if (slot_ < 0) return;
  g_slots[slot_].size.store(0, std::memory_order_release);
  g_slots[slot_].base.store(0, std::memory_order_release);
}

int SegmentGuard::repairs() { return g_repairs.load(); }

}  // namespace spex
