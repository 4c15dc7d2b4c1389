#ifndef FULCRUM_WORKER_DATA_FILE_H_
#define FULCRUM_WORKER_DATA_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace fulcrum {

// Opens the data file at `path` for reading and returns its descriptor (the
// caller closes it). Only a regular file (or a link to one) is opened: a
// FIFO, socket, device or folder under a data root is refused naming what it
// is, without opening it (and, should one take the file's place between the
// check and the open, without waiting on it: a FIFO is opened without
// blocking, so a job whose path names one fails instead of holding the
// worker until some writer comes). NOT_FOUND for a path that does not exist,
// FAILED_PRECONDITION for the rest; `what` starts the messages ("data
// file", "dataset file").
absl::StatusOr<int> OpenDataFile(const std::string& path, const char* what);

}  // namespace fulcrum

#endif  // FULCRUM_WORKER_DATA_FILE_H_
