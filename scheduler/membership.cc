#include "scheduler/membership.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/quote.h"

namespace fulcrum {
namespace {

// Member ids name pods and processes in events, logs and metrics labels:
// letters, digits, '.', '_' and '-', as Kubernetes names are.
bool ValidMemberId(const std::string& id) {
  if (id.empty() || id.size() > 128 || !absl::ascii_isalnum(static_cast<unsigned char>(id[0]))) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

}  // namespace

absl::Status CheckRegistration(const v1::RegisterRequest& request) {
  if (request.role() != v1::SERVER && request.role() != v1::WORKER) {
    return absl::InvalidArgumentError("register: role must be SERVER or WORKER");
  }
  if (request.role() == v1::SERVER && request.address().empty()) {
    return absl::InvalidArgumentError("register: a server must give its address");
  }
  if (!request.requested_id().empty() && !ValidMemberId(request.requested_id())) {
    return absl::InvalidArgumentError(absl::StrCat("register: requested id ", Quote(request.requested_id()),
                                                   " must be 1-128 letters, digits, '.', '_' or '-', starting with "
                                                   "a letter or digit"));
  }
  for (const auto& [field, value] : {std::pair<const char*, const std::string*>{"address", &request.address()},
                                     {"metrics address", &request.metrics_address()},
                                     {"device", &request.device()}}) {
    if (value->size() > 256 || !IsPrintable(*value)) {
      return absl::InvalidArgumentError(absl::StrCat("register: the ", field, " must be at most 256 printable "
                                                     "characters (got ", Quote(*value, 64), ")"));
    }
  }
  if (request.jobs_size() > kMaxHeldJobs)
    return absl::InvalidArgumentError("register: too many held jobs listed");
  for (const std::string& job : request.jobs()) {
    if (job.size() > 256 || !IsPrintable(job)) {
      return absl::InvalidArgumentError(absl::StrCat("register: held job id ", Quote(job, 64), " is not a job id"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Membership::ChooseId(const v1::RegisterRequest& request, absl::Time now) {
  std::string id = request.requested_id();
  if (id.empty()) {
    const char* prefix = request.role() == v1::SERVER ? "server-" : "worker-";
    int64_t& next = request.role() == v1::SERVER ? next_server_ : next_worker_;
    do {
      id = absl::StrCat(prefix, next++);
    } while (members_.count(id) > 0);
  }
  auto existing = members_.find(id);
  if (existing != members_.end() && existing->second->incarnation != request.incarnation() &&
      now - existing->second->last_heartbeat <= lease_) {
    // Another process holds the id and its lease. A restarted process lands
    // here until the old lease runs out.
    const Member& holder = *existing->second;
    return absl::AlreadyExistsError(absl::StrFormat(
        "register: id \"%s\" is held by a live %s (pid %d, address %s, lease renewed %.1fs ago): "
        "choose another id, or, if that process is gone, retry after its lease (%.1fs) expires",
        id, holder.role == v1::SERVER ? "server" : "worker", holder.pid,
        holder.address.empty() ? "none" : holder.address, absl::ToDoubleSeconds(now - holder.last_heartbeat),
        absl::ToDoubleSeconds(lease_)));
  }
  return id;
}

Member* Membership::Add(const v1::RegisterRequest& request, const std::string& id, absl::Time now) {
  auto member = std::make_unique<Member>();
  member->id = id;
  member->role = request.role();
  member->address = request.address();
  member->metrics_address = request.metrics_address();
  member->device = request.device();
  member->pid = request.pid();
  member->incarnation = request.incarnation();
  member->memory_budget = std::max<int64_t>(0, request.memory_budget_bytes());
  member->last_heartbeat = now;
  Member* added = member.get();
  members_[id] = std::move(member);
  return added;
}

Member* Membership::Find(const std::string& id) const {
  auto it = members_.find(id);
  return it == members_.end() ? nullptr : it->second.get();
}

std::string Membership::AddressOf(const std::string& id) const {
  const Member* member = Find(id);
  return member == nullptr ? "" : member->address;
}

bool Membership::Draining(const std::string& id) const {
  const Member* member = Find(id);
  return member != nullptr && member->draining;
}

Member* Membership::Renew(const std::string& id, absl::Time now) {
  Member* member = Find(id);
  if (member != nullptr) member->last_heartbeat = now;
  return member;
}

std::vector<Membership::Lost> Membership::Expire(absl::Time now) {
  std::vector<Lost> lost;
  for (auto it = members_.begin(); it != members_.end();) {
    const absl::Duration silent = now - it->second->last_heartbeat;
    if (silent <= lease_) {
      ++it;
      continue;
    }
    lost.push_back({*it->second, silent});
    it = members_.erase(it);
  }
  return lost;
}

void Membership::CreditDeafTime(absl::Duration deaf, absl::Time now) {
  for (auto& [id, member] : members_) {
    member->last_heartbeat = std::max(member->last_heartbeat, std::min(member->last_heartbeat + deaf, now));
  }
}

std::vector<Member*> Membership::WithRole(v1::Role role) const {
  std::vector<Member*> found;
  for (const auto& [id, member] : members_) {
    if (member->role == role) found.push_back(member.get());
  }
  return found;
}

}  // namespace fulcrum
