#include "daemon/memory/shm_buffer.h"

#include <sys/stat.h>

#include "client/shm_mapping.h"
#include "gtest/gtest.h"
#include "proto/spex.pb.h"

namespace spex {
namespace {

TEST(ShmBuffer, CreateAttachUnlink) {
  auto a = ShmBuffer::Create(10000, "t");
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = ShmBuffer::Create(10000, "t");
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*a)->name(), (*b)->name());        // random names
  EXPECT_GE((*a)->name().size(), 6u + 2 + 32);  // 128 random bits
  struct stat st;
  ASSERT_EQ(stat(("/dev/shm" + (*a)->name()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  v1::BufferDescriptor d;
  (*a)->Describe(&d);
  auto m = ShmMapping::Attach(d.shm().name(), d.shm().size());
  ASSERT_TRUE(m.ok()) << m.status();
  static_cast<char*>((*m)->data())[9999] = 7;
  EXPECT_EQ(static_cast<char*>((*a)->data())[9999], 7);
  EXPECT_FALSE(ShmMapping::Attach(d.shm().name(), 20000).ok());  // larger than the segment
  ASSERT_TRUE((*a)->Unlink().ok());
  EXPECT_NE(stat(("/dev/shm" + (*a)->name()).c_str(), &st), 0);
  static_cast<char*>((*m)->data())[0] = 1;  // mappings stay valid after unlink
  EXPECT_EQ(static_cast<char*>((*a)->data())[0], 1);
  auto late = ShmMapping::Attach(d.shm().name(), 100);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound);
  const std::string bname = (*b)->name();
  b->reset();  // destruction unlinks
  EXPECT_NE(stat(("/dev/shm" + bname).c_str(), &st), 0);
}

TEST(ShmBuffer, RejectsBadTagAndZeroSize) {
  EXPECT_EQ(ShmBuffer::Create(10, "a/b").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmBuffer::Create(0, "a").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace spex
