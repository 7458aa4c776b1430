// ShmMapping (shm_mapping.h): open a described segment by name and map exactly its size.
#include "client/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace spex {

absl::StatusOr<std::unique_ptr<ShmMapping>> ShmMapping::Attach(const std::string& name,
                                                               size_t size) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open shared segment ", name, ": ",
                                            strerror(errno),
                                            " (it is unlinked once every local trainer attached; "
                                            "a late trainer must re-register)"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < size) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("shared segment ", name, " is smaller than the ", size, " bytes described"));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED)
    return absl::InternalError(absl::StrCat("mmap(", name, "): ", strerror(errno)));
  return std::unique_ptr<ShmMapping>(new ShmMapping(base, size));
}

ShmMapping::~ShmMapping() { munmap(base_, size_); }

}  // namespace spex
