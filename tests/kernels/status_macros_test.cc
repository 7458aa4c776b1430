// SPEX_RETURN_IF_ERROR, SPEX_ASSIGN_OR_RETURN and SPEX_CHECK do what their comments promise:
// the first failure returns and stops, values move out, a failed check aborts with its message.
#include "kernels/base/status_macros.h"

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace spex {
namespace {

absl::Status Twice(absl::Status first, absl::Status second, int* reached) {
  SPEX_RETURN_IF_ERROR(first);
  *reached = 1;
  SPEX_RETURN_IF_ERROR(second);
  *reached = 2;
  return absl::OkStatus();
}

TEST(StatusMacros, ReturnIfErrorReturnsTheFirstFailureAndStopsThere) {
  int reached = 0;
  EXPECT_TRUE(Twice(absl::OkStatus(), absl::OkStatus(), &reached).ok());
  EXPECT_EQ(reached, 2);
  reached = 0;
  EXPECT_EQ(Twice(absl::NotFoundError("a"), absl::OkStatus(), &reached), absl::NotFoundError("a"));
  EXPECT_EQ(reached, 0);
  EXPECT_EQ(Twice(absl::OkStatus(), absl::InternalError("b"), &reached), absl::InternalError("b"));
  EXPECT_EQ(reached, 1);
}

absl::StatusOr<std::string> Named(bool ok) {
  if (!ok) return absl::UnavailableError("down");
  return std::string("spex");
}

absl::StatusOr<size_t> Length(bool ok) {
  SPEX_ASSIGN_OR_RETURN(std::string s, Named(ok));
  size_t total = s.size();
  SPEX_ASSIGN_OR_RETURN(s, Named(ok));  // assigns an existing variable
  return total + s.size();
}

TEST(StatusMacros, AssignOrReturnAssignsTheValueOrReturnsTheError) {
  EXPECT_EQ(*Length(true), 8u);
  EXPECT_EQ(Length(false).status(), absl::UnavailableError("down"));
}

TEST(StatusMacros, CheckPassesOnTrueWithoutEvaluatingTheMessage) {
  int evaluated = 0;
  SPEX_CHECK(1 + 1 == 2) << "never " << ++evaluated;
  EXPECT_EQ(evaluated, 0);
}

TEST(StatusMacrosDeathTest, CheckAbortsWithConditionAndMessage) {
  const int doorbells = 0;
  EXPECT_DEATH(SPEX_CHECK(doorbells > 0) << "bucket " << 7,
               "SPEX_CHECK failed: doorbells > 0: bucket 7");
  EXPECT_DEATH(SPEX_CHECK(doorbells > 0), "SPEX_CHECK failed: doorbells > 0");
}

}  // namespace
}  // namespace spex
