// Keeps a process registered with the scheduler: registers, heartbeats on an
// owned thread, and registers again when the scheduler says the lease is gone
// (or the scheduler restarted). Workers read their assignment from the
// heartbeat responses through the callback.
#ifndef FULCRUM_COMMON_MEMBERSHIP_CLIENT_H_
#define FULCRUM_COMMON_MEMBERSHIP_CLIENT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/sync.h"
#include "fulcrum/v1/cluster.grpc.pb.h"

namespace fulcrum {

class MembershipClient {
 public:
  struct Options {
    std::string scheduler;  // host:port
    v1::Role role = v1::ROLE_UNSPECIFIED;
    std::string address;
    std::string metrics_address;
    std::string requested_id;
    std::string device;
    int64_t memory_budget = 0;  // reported on register (bytes; 0: none)
    // Called on the heartbeat thread after every successful heartbeat.
    std::function<void(const v1::HeartbeatResponse&)> on_heartbeat;
    // Called before each heartbeat: the job this process works on now.
    std::function<std::string()> current_job;
    // Servers: the jobs whose parameters this process holds (sent on register).
    std::function<std::vector<std::string>()> held_jobs;
    // Servers: the bytes each held job takes now (sent with every
    // heartbeat: the scheduler's claims follow the tables as they grow).
    std::function<std::map<std::string, int64_t>()> held_bytes;
  };

  explicit MembershipClient(Options options);
  ~MembershipClient();  // calls Stop()

  void Start();
  void Stop();
  // The id the scheduler gave this process ("" until registered).
  std::string member_id() const;
  // Whether the last successful heartbeat is younger than the lease: a
  // server without a valid lease takes no writes (it may have been failed
  // over while cut off from the scheduler).
  bool LeaseValid() const;

  // Heartbeats at once (unless already hurried) and then every 50 ms for
  // the next `period`, instead of at the scheduler's interval: a worker that
  // lost a server calls it to learn the new shard map as soon as the
  // scheduler publishes it, not up to an interval later.
  void Hurry(absl::Duration period = absl::Seconds(2));

  // Sends a work report (workers). Retries UNAVAILABLE briefly.
  absl::Status Report(v1::WorkReport report);

  // Servers: asks the scheduler to move this server's shards away, then
  // waits until a heartbeat says it is drained (true) or `timeout` passes or
  // the scheduler cannot be reached (false).
  bool LeaveAndDrain(absl::Duration timeout);

 private:
  void Loop();
  bool RegisterOnce();
  bool HeartbeatOnce();

  const Options options_;
  const uint64_t incarnation_;  // random, per process start
  std::unique_ptr<v1::ClusterService::Stub> stub_;
  mutable Mutex mu_;  // guards the members below
  std::string member_id_ ABSL_GUARDED_BY(mu_);
  std::string last_id_ ABSL_GUARDED_BY(mu_);  // kept across re-registrations
  int64_t interval_ms_ ABSL_GUARDED_BY(mu_) = 500;
  int64_t lease_ms_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_renewal_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool drained_ ABSL_GUARDED_BY(mu_) = false;
  bool unreachable_ ABSL_GUARDED_BY(mu_) = false;  // the last heartbeat failed
  absl::Time hurry_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool hurry_now_ ABSL_GUARDED_BY(mu_) = false;  // wakes the heartbeat loop
  bool Woken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || hurry_now_; }
  bool DrainSettled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return drained_ || unreachable_ || stopping_; }
  std::thread thread_;
};

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_MEMBERSHIP_CLIENT_H_
