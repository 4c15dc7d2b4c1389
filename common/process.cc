#include "common/process.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace fulcrum {
namespace {

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR2);  // RequestShutdown
  return set;
}

}  // namespace

void BlockTerminationSignals() {
  sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int WaitForShutdown() {
  sigset_t set = TerminationSet();
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig == SIGUSR2 ? 0 : sig;
}

void RequestShutdown() { kill(getpid(), SIGUSR2); }

void ParseFlags(int argc, char** argv, const char* usage) {
  AcceptDashedFlags(argc, argv);
  absl::FlagsUsageConfig config;
  // Abseil lists on --help only flags defined in a file named like the
  // program; ours live in each binary's main.cc, the shared daemon files and
  // the tools' files under bench/.
  config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "main.cc") || absl::EndsWith(file, "common/daemon.cc") ||
           absl::EndsWith(file, "common/security_flags.cc") || absl::StrContains(file, "bench/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  // Every option is a flag: anything else (a second command line pasted
  // after the first, a value without its flag) is refused, not ignored.
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "%s: unexpected argument \"%s\": every option is a --flag (--help lists them)\n",
                 argv[0], absl::CHexEscape(rest[1]).c_str());
    std::exit(1);
  }
}

void AcceptDashedFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (strncmp(arg, "--", 2) != 0) continue;
    if (arg[2] == '\0') break;  // "--": the rest are not flags
    for (char* c = arg + 2; *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
}

const char* FileKindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "of another type";
}

absl::Status CheckReplaceable(const std::string& path) {
  struct stat info {};
  if (lstat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  }
  const char* what = S_ISLNK(info.st_mode)   ? "a symbolic link (give the path of the file it points to)"
                     : S_ISREG(info.st_mode) ? nullptr
                                             : FileKindOf(info.st_mode);
  if (what != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("will not write ", path, ": it is ", what, ", and only a regular file is replaced"));
  }
  if (access(path.c_str(), W_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("will not replace ", path, ": it is not writable (", strerror(errno), ")"));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  if (absl::Status replaceable = CheckReplaceable(path); !replaceable.ok()) return replaceable;
  std::string temp = absl::StrCat(path, ".tmp.", getpid());
  unlink(temp.c_str());  // a leftover of an earlier process with this pid
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  FILE* file = fd >= 0 ? fdopen(fd, "w") : nullptr;
  if (file == nullptr) {
    const int error = errno;
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("cannot write ", temp, ": ", strerror(error)));
  }
  size_t written = fwrite(contents.data(), 1, contents.size(), file);
  bool ok = written == contents.size() && fflush(file) == 0 && fsync(fileno(file)) == 0;
  ok = (fclose(file) == 0) && ok;
  if (!ok || rename(temp.c_str(), path.c_str()) != 0) {
    unlink(temp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WritePortFile(const std::string& path, int grpc_port, int metrics_port,
                           const std::string& id) {
  return WriteFileAtomically(
      path, absl::StrCat("{\"grpc_port\": ", grpc_port, ", \"metrics_port\": ", metrics_port,
                         ", \"pid\": ", getpid(), ", \"id\": \"", id, "\"}\n"));
}

namespace {

// The bytes of a "KEY: N kB" line of /proc/PID/status; 0 when absent.
int64_t StatusBytes(int64_t pid, const std::string& key) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string word;
  while (in >> word) {
    if (word == key) {
      int64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

}  // namespace

int64_t ResidentBytes(int64_t pid) { return StatusBytes(pid, "VmRSS:"); }

int64_t PeakResidentBytes(int64_t pid) { return StatusBytes(pid, "VmHWM:"); }

}  // namespace fulcrum
