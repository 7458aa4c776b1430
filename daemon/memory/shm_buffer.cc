#include "daemon/memory/shm_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/memory/segment_janitor.h"
#include "proto/spex.pb.h"

namespace spex {
namespace {

std::string RandomHex(int bytes) {
  absl::BitGen gen;  // seeded from the OS entropy source
  std::string out;
  for (int i = 0; i < bytes; ++i)
    absl::StrAppendFormat(&out, "%02x", absl::Uniform<int>(gen, 0, 256));
  return out;
}

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmBuffer>> ShmBuffer::Create(size_t size, const std::string& tag) {
  for (char c : tag) {
    if (!isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') {
      return absl::InvalidArgumentError(
          absl::StrCat("shm tag '", tag, "' has a character other than [A-Za-z0-9_.-]"));
    }
  }
  if (size == 0) return absl::InvalidArgumentError("shm segment size must be > 0");
  std::string name = absl::StrCat("/spex-", tag, "-", RandomHex(16));
  // Told to the janitor before the name exists, so that no moment leaves it unknown to it.
  SegmentJanitor::Track(name);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    absl::Status s = Errno(absl::StrCat("shm_open(", name, ")"));
    SegmentJanitor::Untrack(name);
    return s;
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    absl::Status s = Errno(absl::StrCat("ftruncate(", name, ", ", size, ") (is /dev/shm full?)"));
    close(fd);
    shm_unlink(name.c_str());
    SegmentJanitor::Untrack(name);
    return s;
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    absl::Status s = Errno(absl::StrCat("mmap(", name, ", ", size, ")"));
    shm_unlink(name.c_str());
    SegmentJanitor::Untrack(name);
    return s;
  }
  return std::unique_ptr<ShmBuffer>(new ShmBuffer(std::move(name), base, size));
}

ShmBuffer::~ShmBuffer() {
  Unlink().IgnoreError();
  guard_.reset();
  munmap(base_, size_);
}

void ShmBuffer::Describe(v1::BufferDescriptor* out) const {
  out->mutable_shm()->set_name(name_);
  out->mutable_shm()->set_size(size_);
}

absl::Status ShmBuffer::Unlink() {
  if (unlinked_) return absl::OkStatus();
  unlinked_ = true;
  const bool failed = shm_unlink(name_.c_str()) != 0 && errno != ENOENT;
  const absl::Status s = failed ? Errno(absl::StrCat("shm_unlink(", name_, ")")) : absl::OkStatus();
  SegmentJanitor::Untrack(name_);
  return s;
}

}  // namespace spex
