#include "gtest/gtest.h"
#include "proto/spex.pb.h"
TEST(Proto, RoundTrip) {
  spex::v1::RegisterBucketRequest r;
  r.set_bucket_id(7);
  r.set_elements(1000);
  r.mutable_compressor()->set_name("dense");
  std::string s;
  ASSERT_TRUE(r.SerializeToString(&s));
  spex::v1::RegisterBucketRequest q;
  ASSERT_TRUE(q.ParseFromString(s));
  EXPECT_EQ(q.bucket_id(), 7u);
  EXPECT_EQ(q.compressor().name(), "dense");
}
