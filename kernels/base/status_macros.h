// Status propagation and invariant checks, one spelling for the whole tree:
//   SPEX_RETURN_IF_ERROR(buffer->Map());             // returns the Status when it is not OK
//   SPEX_ASSIGN_OR_RETURN(void* d, slots.Get(0, n));  // declares/assigns, or returns the error
//   SPEX_CHECK(!doorbells_.empty()) << "bucket " << id;  // a broken invariant: log, abort
// SPEX_CHECK is for programming errors only (never for input, peers or the device: those are
// Status values). SPEX_DCHECK is SPEX_CHECK in builds without NDEBUG and nothing otherwise.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SPEX_RETURN_IF_ERROR(expr)                                                      \
  do {                                                                                  \
    if (::absl::Status spex_status_ = (expr); ABSL_PREDICT_FALSE(!spex_status_.ok())) { \
      return spex_status_;                                                              \
    }                                                                                   \
  } while (0)

// `lhs` may declare a variable (`auto x`, `std::string s`) or name one; it must not contain an
// unparenthesised comma. The statement expands to several, so it cannot be the body of an
// unbraced if.
#define SPEX_ASSIGN_OR_RETURN(lhs, expr) \
  SPEX_ASSIGN_OR_RETURN_IMPL_(SPEX_STATUS_MACROS_CONCAT_(spex_statusor_, __LINE__), lhs, expr)

#define SPEX_CHECK(cond)              \
  while (ABSL_PREDICT_FALSE(!(cond))) \
  ::spex::status_macros_internal::CheckFailure(#cond, __FILE__, __LINE__).stream()

#ifdef NDEBUG
#define SPEX_DCHECK(cond)  \
  while (false && !(cond)) \
  ::spex::status_macros_internal::CheckFailure(#cond, __FILE__, __LINE__).stream()
#else
#define SPEX_DCHECK(cond) SPEX_CHECK(cond)
#endif

// Implementation details below.

#define SPEX_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define SPEX_STATUS_MACROS_CONCAT_(a, b) SPEX_STATUS_MACROS_CONCAT_INNER_(a, b)
#define SPEX_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)                       \
  auto statusor = (expr);                                                      \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace spex::status_macros_internal {

// Collects the message of a failed SPEX_CHECK; its destructor writes one line to stderr
// ("file:line: SPEX_CHECK failed: cond: message") and aborts.
class CheckFailure {
 public:
  CheckFailure(const char* condition, const char* file, int line)
      : condition_(condition), file_(file), line_(line) {}
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  ~CheckFailure() {
    const std::string message = message_.str();
    std::fprintf(stderr, "%s:%d: SPEX_CHECK failed: %s%s%s\n", file_, line_, condition_,
                 message.empty() ? "" : ": ", message.c_str());
    std::fflush(stderr);
    std::abort();
  }
  std::ostream& stream() { return message_; }

 private:
  const char* condition_;
  const char* file_;
  int line_;
  std::ostringstream message_;
};

}  // namespace spex::status_macros_internal
