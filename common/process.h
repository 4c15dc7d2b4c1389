// Process plumbing shared by every binary: termination signals and the
// "port file" through which a process started with port 0 tells its parent
// which ports it bound.
#ifndef FULCRUM_COMMON_PROCESS_H_
#define FULCRUM_COMMON_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace fulcrum {

// Blocks SIGTERM, SIGINT and SIGPIPE in the calling thread and every thread it
// creates afterwards. Call first thing in main(), before any thread exists.
void BlockTerminationSignals();

// Waits until SIGTERM/SIGINT arrives or RequestShutdown() is called; returns
// the signal number (0 for RequestShutdown). Call from one thread only.
int WaitForShutdown();

// Makes WaitForShutdown() return (e.g. after a fatal error in a worker loop).
void RequestShutdown();

// Parses the command line of a Fulcrum binary: accepts dashed flag names,
// makes --help list the binary's own flags, and sets the usage message.
// Exits 1 on an argument that is not a flag.
void ParseFlags(int argc, char** argv, const char* usage);

// Rewrites "--flag-name[=v]" as "--flag_name[=v]" in place so that every
// binary accepts the dashed spelling of its (Abseil, underscored) flags.
void AcceptDashedFlags(int argc, char** argv);

// What a file of `mode` that is not a regular one is, for messages: "a
// folder", "a FIFO", "a socket", "a character device", "a block device",
// "a symbolic link" (from lstat) or "of another type".
const char* FileKindOf(mode_t mode);

// Whether WriteFileAtomically may put a file at `path`: nothing is there,
// or a regular file this process may write. FAILED_PRECONDITION naming
// what is there otherwise (a device, FIFO, socket, folder or symbolic link:
// renaming over it would replace it, /dev/full with a plain file when run
// as root) or that the file is not writable.
absl::Status CheckReplaceable(const std::string& path);

// Atomically writes `contents` to `path` (write to a temp file, rename),
// once CheckReplaceable(path) agrees. The temp file is created anew (never
// through a link left at its name).
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

// Writes {"grpc_port": G, "metrics_port": M, "pid": P, "id": "..."} to path.
absl::Status WritePortFile(const std::string& path, int grpc_port, int metrics_port,
                           const std::string& id);

// The resident set size of process `pid` in bytes (VmRSS), 0 when it cannot
// be read (the process is gone).
int64_t ResidentBytes(int64_t pid);
// Its peak resident set size (VmHWM), the same way.
int64_t PeakResidentBytes(int64_t pid);

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_PROCESS_H_
