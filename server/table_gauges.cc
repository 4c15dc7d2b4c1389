#include "server/table_gauges.h"

#include "absl/time/clock.h"

namespace fulcrum {
namespace {

constexpr absl::Duration kRefreshEvery = absl::Milliseconds(500);

prometheus::Family<prometheus::Gauge>& Gauge(prometheus::Registry* registry, const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(*registry);
}

}  // namespace

TableGauges::TableGauges(prometheus::Registry* registry)
    : rows_(Gauge(registry, "fulcrum_server_table_rows", "Rows of a sparse table on this server")),
      bytes_(Gauge(registry, "fulcrum_server_table_bytes", "Bytes a sparse table's rows, index and filter take here")),
      admitted_(Gauge(registry, "fulcrum_server_table_admitted_rows",
                      "Rows a sparse table created here (keys past its frequency filter) since the job's setup")),
      expired_(Gauge(registry, "fulcrum_server_table_expired_rows",
                     "Rows a sparse table dropped here for not being pushed for expireAfter steps")) {}

void TableGauges::Update(const std::string& job_id, const SparseTables& tables, bool force) {
  const absl::Time now = absl::Now();
  MutexLock lock(&mu_);
  absl::Time& last = updated_[job_id];
  if (!force && now - last < kRefreshEvery) return;
  last = now;
  for (const SparseTableStats& table : tables.Stats()) {
    const std::map<std::string, std::string> labels = {{"job_id", job_id}, {"table", table.name}};
    rows_.Add(labels).Set(static_cast<double>(table.rows));
    bytes_.Add(labels).Set(static_cast<double>(table.bytes));
    admitted_.Add(labels).Set(static_cast<double>(table.admissions));
    expired_.Add(labels).Set(static_cast<double>(table.expiries));
    tables_[job_id].insert(table.name);
  }
}

void TableGauges::Remove(const std::string& job_id) {
  MutexLock lock(&mu_);
  auto it = tables_.find(job_id);
  if (it != tables_.end()) {
    for (const std::string& table : it->second) {
      const std::map<std::string, std::string> labels = {{"job_id", job_id}, {"table", table}};
      for (auto* family : {&rows_, &bytes_, &admitted_, &expired_}) family->Remove(&family->Add(labels));
    }
    tables_.erase(it);
  }
  updated_.erase(job_id);
}

}  // namespace fulcrum
