// A std::vector whose resize leaves new elements of a trivial type uninitialized: scratch that a
// pass fills completely right after, reused across steps by buckets of different sizes. A plain
// vector zeroes every element a resize adds, so one scratch shared by a 3.2M-element bucket and a
// 52k-element one cleared megabytes at every step that nothing read (memset in the daemon's
// profile, docs/benchmarks.md).
#pragma once

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace spex {

template <class T>
class NoInitAllocator : public std::allocator<T> {
 public:
  template <class U>
  struct rebind {
    using other = NoInitAllocator<U>;
  };
  NoInitAllocator() = default;
  template <class U>
  NoInitAllocator(const NoInitAllocator<U>&) noexcept {}  // NOLINT: converting, as std::allocator
  // Value-initialization (resize, the count constructor) becomes default-initialization.
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible<U>::value) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// Elements a resize adds hold whatever was there: write them before reading them.
template <class T>
using NoInitVector = std::vector<T, NoInitAllocator<T>>;

}  // namespace spex
