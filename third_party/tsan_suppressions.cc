// ThreadSanitizer's built-in suppressions for --config=tsan, linked into every binary of that
// configuration through //third_party:absl. Only abseil's own internals are listed, never spex
// code: absl::Mutex hands a sleeping thread's identity (memory LowLevelAlloc took with mmap) to
// the thread that wakes it inside its own annotated critical sections, where TSan records no
// happens-before edge, so g++'s TSan reports the waker's futex word update as racing with the
// mmap that created it.

extern "C" const char* __tsan_default_suppressions() {
  return "race:absl::*::synchronization_internal::Waiter::Post\n"
         "race:absl::*::synchronization_internal::Waiter::Wait\n"
         "race:absl::*::synchronization_internal::Waiter::Poke\n";
}
