// The cluster's members and their leases: who registered, under which id
// and process incarnation, and whose lease ran out. Jobs are not its
// business: the JobManager moves a lost member's work (failover, partitions)
// with what Expire() returns.
//
// Not thread-safe: the JobManager keeps it under its lock, where clang's
// analysis checks every use.
#ifndef FULCRUM_SCHEDULER_MEMBERSHIP_H_
#define FULCRUM_SCHEDULER_MEMBERSHIP_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fulcrum/v1/cluster.pb.h"

namespace fulcrum {

struct Member {
  std::string id;
  v1::Role role = v1::ROLE_UNSPECIFIED;
  std::string address;
  std::string metrics_address;
  std::string device;
  int64_t pid = 0;
  uint64_t incarnation = 0;  // the process start it registered from
  absl::Time last_heartbeat;
  std::string job_id;  // workers: the job assigned, if any
  bool draining = false;  // servers: asked to leave; their shards move away
  int64_t memory_budget = 0;  // as registered; 0: not reported
  // Servers: the bytes each job held there took at the last heartbeat (of
  // jobs the scheduler knows).
  std::map<std::string, int64_t> held_bytes;
  // What the last heartbeat said job `job_id` takes here (0: nothing).
  int64_t HeldBytes(const std::string& job_id) const {
    auto it = held_bytes.find(job_id);
    return it == held_bytes.end() ? 0 : it->second;
  }
};

// The most jobs a server may list as held (registration, heartbeats).
inline constexpr int kMaxHeldJobs = 100000;
// The most bytes a heartbeat may say one job takes on a server (64 TiB, more
// than any server's memory): sums over every job a server lists stay far
// from overflowing.
inline constexpr int64_t kMaxHeldBytes = int64_t{1} << 46;

// INVALID_ARGUMENT naming the field for a registration no member may make: a
// role other than SERVER or WORKER, a server without an address, an id that
// is not 1-128 letters, digits, '.', '_' or '-', unprintable or oversized
// addresses, device or held job ids.
absl::Status CheckRegistration(const v1::RegisterRequest& request);

class Membership {
 public:
  explicit Membership(absl::Duration lease) : lease_(lease) {}

  // The id a registration gets: the requested one, else the next free
  // `server-N` / `worker-N`. ALREADY_EXISTS (naming the holder's pid and
  // address) while a process of another incarnation holds the id and its
  // lease: two live processes never share an id.
  absl::StatusOr<std::string> ChooseId(const v1::RegisterRequest& request, absl::Time now);
  // Installs the member under `id`, replacing whoever had it.
  Member* Add(const v1::RegisterRequest& request, const std::string& id, absl::Time now);

  Member* Find(const std::string& id) const;
  bool Contains(const std::string& id) const { return members_.count(id) > 0; }
  // The member's address, or "" when it is not registered.
  std::string AddressOf(const std::string& id) const;
  bool Draining(const std::string& id) const;
  // Renews the member's lease; nullptr when it is unknown (register again).
  Member* Renew(const std::string& id, absl::Time now);

  struct Lost {
    Member member;
    absl::Duration silent;  // since its last heartbeat
  };
  // Removes and returns every member silent for longer than a lease.
  std::vector<Lost> Expire(absl::Time now);
  // The scheduler itself did not run for `deaf` (paused, starved): it heard
  // no heartbeat then, so that time does not count as anyone's silence.
  // Every member's last heartbeat moves `deaf` later (never past `now`).
  void CreditDeafTime(absl::Duration deaf, absl::Time now);

  const std::map<std::string, std::unique_ptr<Member>>& all() const { return members_; }
  std::vector<Member*> WithRole(v1::Role role) const;

  // The id counters, persisted in the scheduler's meta record.
  int64_t next_number(v1::Role role) const { return role == v1::SERVER ? next_server_ : next_worker_; }
  void set_next_number(v1::Role role, int64_t n) { (role == v1::SERVER ? next_server_ : next_worker_) = n; }

 private:
  const absl::Duration lease_;
  std::map<std::string, std::unique_ptr<Member>> members_;
  int64_t next_server_ = 0;
  int64_t next_worker_ = 0;
};

}  // namespace fulcrum

#endif  // FULCRUM_SCHEDULER_MEMBERSHIP_H_
