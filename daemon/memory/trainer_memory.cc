// A trainer's own memory as its input slot (trainer_memory.h): taking the descriptor, the checks,
// the read-only mapping.
#include "daemon/memory/trainer_memory.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace spex {
namespace {

// Closes a descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

// A duplicate of descriptor `fd` of process `pid`: pidfd_getfd through its pidfd, else a new open
// of /proc/<pid>/fd/<fd> (allowed to the trainer's own user, where pidfd_getfd needs the right to
// ptrace it). The caller is that process, in the middle of its RegisterBucket call.
absl::StatusOr<int> TakeDescriptor(int pidfd, uint32_t pid, int fd) {
  const auto not_open = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "own_input.fd ", fd, " is not an open descriptor of the trainer (pid ", pid, ")"));
  };
  int got_errno = 0;
  if (pidfd >= 0) {
    const long dup = syscall(SYS_pidfd_getfd, pidfd, fd, 0);
    if (dup >= 0) return static_cast<int>(dup);
    got_errno = errno;
    if (got_errno == EBADF) return not_open();
  }
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  const int opened = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (opened >= 0) return opened;
  const int open_errno = errno;
  if (open_errno == ENOENT) return not_open();
  return absl::FailedPreconditionError(absl::StrCat(
      "spexd cannot take descriptor ", fd, " of the trainer (pid ", pid,
      "): pidfd_getfd: ", got_errno != 0 ? std::strerror(got_errno) : "no pidfd", "; open(", path,
      "): ", std::strerror(open_errno),
      ". Run the trainers as spexd's user (or spexd as root), or register without own_input (the "
      "trainer then copies its input into the slot)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerMemory>> TrainerMemory::Map(int pidfd, uint32_t pid,
                                                                  uint32_t uid,
                                                                  const TrainerInputSpec& spec,
                                                                  uint64_t bytes) {
  if (spec.fd < 0 || spec.fd > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("own_input.fd must be a file descriptor of the trainer, got ", spec.fd));
  }
  if (pid == 0) {
    return absl::FailedPreconditionError(
        "the session's process is unknown (no SO_PEERCRED), so spexd cannot take its descriptor: "
        "register without own_input");
  }
  absl::StatusOr<int> taken = TakeDescriptor(pidfd, pid, static_cast<int>(spec.fd));
  if (!taken.ok()) return taken.status();
  Fd file{*taken};
  struct stat st {};
  struct statfs fs {};
  if (fstat(file.fd, &st) != 0 || fstatfs(file.fd, &fs) != 0) {
    return absl::InternalError(
        absl::StrCat("fstat of the trainer's own_input.fd ", spec.fd, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode) || (fs.f_type != TMPFS_MAGIC &&
                               fs.f_type != static_cast<decltype(fs.f_type)>(HUGETLBFS_MAGIC))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "own_input.fd ", spec.fd,
        " is not a shared-memory file (a /dev/shm file or a memfd): put the bucket in shared "
        "memory first (torch: tensor.share_memory_())"));
  }
  if (st.st_uid != uid) {
    return absl::InvalidArgumentError(absl::StrCat("own_input.fd ", spec.fd, " is a file of user ",
                                                   st.st_uid, ", the trainer runs as user ", uid,
                                                   ": hand over memory of your own"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (spec.offset > size || bytes > size - spec.offset) {
    return absl::InvalidArgumentError(absl::StrCat("own_input: the file holds ", size,
                                                   " bytes; the bucket needs ", bytes,
                                                   " from offset ", spec.offset));
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = spec.offset - spec.offset % page;
  const size_t length = static_cast<size_t>(spec.offset - start + bytes);
  void* base = mmap(nullptr, length, PROT_READ, MAP_SHARED, file.fd, static_cast<off_t>(start));
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mapping the trainer's own_input (", bytes,
                                            " bytes): ", std::strerror(errno)));
  }
  const void* data = static_cast<const uint8_t*>(base) + (spec.offset - start);
  return std::unique_ptr<TrainerMemory>(
      new TrainerMemory(base, length, data, bytes, st.st_dev, st.st_ino, spec.offset));
}

TrainerMemory::TrainerMemory(void* base, size_t length, const void* data, uint64_t bytes, dev_t dev,
                             ino_t ino, uint64_t offset)
    : base_(base),
      length_(length),
      data_(data),
      bytes_(bytes),
      dev_(dev),
      ino_(ino),
      offset_(offset),
      guard_(std::make_unique<SegmentGuard>(base, length)) {}

TrainerMemory::~TrainerMemory() {
  guard_.reset();
  munmap(base_, length_);
}

}  // namespace spex
