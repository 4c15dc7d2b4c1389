#include "worker/data_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "common/quote.h"

namespace fulcrum {

absl::StatusOr<int> OpenDataFile(const std::string& path, const char* what) {
  // What is not a regular file is refused before it is opened: opening some
  // devices does something (a watchdog arms), a socket cannot be opened.
  struct stat named {};
  if (stat(path.c_str(), &named) == 0 && !S_ISREG(named.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " ", Quote(path), " is not a regular file (it is ", FileKindOf(named.st_mode), ")"));
  }
  // It may be replaced between the two: O_NONBLOCK, so that opening a FIFO
  // does not wait for a writer, and fstat tells it apart.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return absl::NotFoundError(absl::StrCat(what, " ", Quote(path), " does not exist"));
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", what, " ", Quote(path), ": ", std::strerror(error)));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", what, " ", Quote(path), ": ", std::strerror(error)));
  }
  if (!S_ISREG(info.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        what, " ", Quote(path), " is not a regular file (it is ", FileKindOf(info.st_mode), ")"));
  }
  // Reads of a regular file do not block anyway; blocking mode is what the
  // readers expect.
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int error = errno;
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", what, " ", Quote(path), ": ", std::strerror(error)));
  }
  return fd;
}

}  // namespace fulcrum
