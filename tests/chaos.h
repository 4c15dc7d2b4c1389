// A seeded chaos schedule over a live local cluster: while a deterministic
// BSP job trains, the faults Kubernetes and machines produce every day hit
// it one after another (kill -9 of a server, a worker or the scheduler with
// an immediate restart, a server replaced by a new one, SIGSTOP/SIGCONT of
// any process). The job must end SUCCEEDED with parameters bit-identical to
// an undisturbed run and every example used exactly once per epoch.
// tests/chaos_test.cc runs one schedule; bench/chaos_bench.cc runs many and
// reports faults survived, stalls and memory.
#ifndef FULCRUM_TESTS_CHAOS_H_
#define FULCRUM_TESTS_CHAOS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fulcrum/v1/job.pb.h"

namespace fulcrum {

struct ChaosOptions {
  uint64_t seed = 1;
  int faults = 5;
  int servers = 3;
  int workers = 3;
  int replicas = 2;
  // The job: a dense MLP (false) or a click model whose embeddings live in
  // sparse tables on the servers (true).
  bool click = false;
  std::string dir;  // the local cluster's folder (created)
};

struct ChaosFault {
  std::string what;        // "kill -9 server-1, restarted at once"
  int64_t step = 0;        // the job's step when it hit
  absl::Duration stall;    // from the fault until the job passed its step by 5
};

struct ChaosResult {
  v1::JobStatus job;                  // the disturbed job, ended
  std::vector<ChaosFault> faults;
  bool bit_identical = false;         // parameters (tables included) equal to the reference run's
  bool audit_exact = false;           // every example once per epoch, every chunk
  std::string mismatch;               // what differs, when something does
  std::map<std::string, int64_t> max_rss_bytes;  // by role, at the end
};

// The job every schedule runs: BSP, 4096 synthetic examples, 12 epochs; or
// (`click`) a BSP factorization machine over sparse tables, 24576 synthetic
// click examples, 2 epochs.
v1::JobSpec ChaosJobSpec(bool click = false);

// Starts a cluster in options.dir, runs ChaosJobSpec() undisturbed (the
// reference), then again under the schedule `options.seed` picks. An error
// when the cluster cannot start or a step of the schedule cannot be taken;
// the job's own outcome is in the result.
absl::StatusOr<ChaosResult> RunChaosSchedule(const ChaosOptions& options);

}  // namespace fulcrum

#endif  // FULCRUM_TESTS_CHAOS_H_
