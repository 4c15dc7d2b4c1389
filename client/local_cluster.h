// A cluster of Fulcrum processes on loopback: one scheduler, N servers and M
// workers, each started with port 0 and its stderr in DIR/logs/ID.log. The
// process table is kept in DIR/cluster.json (fulcrum.v1.LocalClusterFile).
// Used by `fulcrum local up|add|down`, by demo.sh and by the integration
// tests (which kill every process by pid in teardown, even on failure).
#ifndef FULCRUM_CLIENT_LOCAL_CLUSTER_H_
#define FULCRUM_CLIENT_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fulcrum/v1/local_cluster.pb.h"

namespace fulcrum {

// The folder holding fulcrum-scheduler, fulcrum-server and fulcrum-worker:
// $FULCRUM_BIN_DIR if set, else the folder of the running executable.
std::string DefaultBinDir();

// Starts argv[0] with `argv` in its own session, stdout and stderr appended
// to `log`, stdin from /dev/null; returns its pid (the caller reaps it).
absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv, const std::string& log);

// Makes sure `tls_dir` holds the development CA, certificate and tokens of
// scripts/dev-certs.sh (running it, found beside the binaries' source tree,
// when they are missing).
absl::Status EnsureDevCertificates(const std::string& tls_dir, const std::string& bin_dir);

class LocalCluster {
 public:
  struct Options {
    std::string dir;       // created if missing
    std::string bin_dir;   // default DefaultBinDir()
    int servers = 2;
    int workers = 2;
    int replicas = 1;
    std::vector<std::string> scheduler_flags;  // extra flags, e.g. "--lease-ms=1000"
    std::vector<std::string> server_flags;
    std::vector<std::string> worker_flags;
    absl::Duration start_timeout = absl::Seconds(30);
    // mTLS between all processes, a cluster credential and a JobService
    // token, from DIR/tls (made with scripts/dev-certs.sh if missing).
    bool tls = false;
  };

  // Starts the scheduler, then the servers and workers, waits until each has
  // written its port file, and writes cluster.json. On failure everything
  // started so far is killed.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(Options options);
  // Opens a cluster started by another process (fulcrum local add/down).
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Open(const std::string& dir);

  // Kills every process still running with SIGKILL if this object started
  // them and Release() was not called.
  ~LocalCluster();

  absl::StatusOr<v1::LocalProcess> AddServer();
  // `extra_flags` go to this worker only (e.g. "--device=cuda:0").
  absl::StatusOr<v1::LocalProcess> AddWorker(std::vector<std::string> extra_flags = {});

  // SIGTERM to every process, then SIGKILL to any still alive after `grace`.
  // Removes cluster.json. UNAVAILABLE naming the processes that had to be
  // killed (did not exit on SIGTERM in time).
  absl::Status Down(absl::Duration grace = absl::Seconds(10));
  // Starts the scheduler again on its old port and state folder (after it
  // died or was killed), replacing its entry in cluster.json.
  absl::StatusOr<v1::LocalProcess> RestartScheduler();
  // Starts a dead server again under its id, on its state folder (as a pod
  // restarted with its volume). FAILED_PRECONDITION while it still runs.
  absl::StatusOr<v1::LocalProcess> RestartServer(const std::string& id);
  // Starts a dead server or worker again under its id (a server on its state
  // folder). FAILED_PRECONDITION while it still runs.
  absl::StatusOr<v1::LocalProcess> RestartMember(const std::string& id);
  // Sends `signal` to the process with member id `id`.
  absl::Status Signal(const std::string& id, int signal);
  // Leaves the processes running when this object goes away (--detach).
  void Release() { owned_ = false; }

  const v1::LocalClusterFile& file() const { return file_; }
  // The flags that give a process the cluster's TLS and tokens (none without TLS).
  std::vector<std::string> SecurityFlags(bool scheduler) const;
  const std::string& scheduler_address() const { return file_.scheduler(); }
  std::string dir() const { return file_.dir(); }

 private:
  LocalCluster() = default;
  absl::StatusOr<v1::LocalProcess> Spawn(const std::string& role, const std::string& id,
                                         std::vector<std::string> flags);
  absl::Status WriteFile() const;
  std::string NextId(const std::string& role) const;
  std::vector<std::string> ServerFlags(const std::string& id) const;

  Options options_;
  v1::LocalClusterFile file_;
  bool owned_ = false;
};

}  // namespace fulcrum

#endif  // FULCRUM_CLIENT_LOCAL_CLUSTER_H_
