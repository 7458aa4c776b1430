#include "daemon/merge/merger.h"

#include <string>

#include "gtest/gtest.h"

namespace spex {
namespace {

TEST(MergerTest, NoneExchangesOneBucketAtATime) {
  auto m = MakeMerger("none");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_STREQ((*m)->name(), "none");
  MergeCandidate c[3] = {{4, 0, 10, true}, {7, 0, 20, true}, {2, 1, 30, false}};
  EXPECT_EQ((*m)->NextGroup(absl::MakeConstSpan(c, 3)), 1u);
  EXPECT_EQ((*m)->NextGroup(absl::MakeConstSpan(c, 1)), 1u);
}

TEST(MergerTest, PlannedPoliciesAreRefusedClearly) {
  for (const char* name : {"fixed", "omgs", "rgmerge"}) {
    auto m = MakeMerger(name);
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(m.status().message().find("not implemented"), std::string::npos) << m.status();
  }
  auto m = MakeMerger("horovod");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("accepted: none"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace spex
