// Per-table gauges of the sparse tables a server holds, labelled by job and
// table: rows, bytes, and rows admitted and expired since the job was set up
// here. Refreshed at most every half second per job (a table's figures are
// summed over its buckets), removed when the job is dropped. Thread-safe.
#ifndef FULCRUM_SERVER_TABLE_GAUGES_H_
#define FULCRUM_SERVER_TABLE_GAUGES_H_

#include <map>
#include <set>
#include <string>

#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/sync.h"
#include "server/sparse_tables.h"

namespace fulcrum {

class TableGauges {
 public:
  explicit TableGauges(prometheus::Registry* registry);

  // Sets the job's gauges from `tables` unless they were set less than half a
  // second ago (`force`: now anyway).
  void Update(const std::string& job_id, const SparseTables& tables, bool force = false);
  // Removes the job's gauges.
  void Remove(const std::string& job_id);

 private:
  prometheus::Family<prometheus::Gauge>& rows_;
  prometheus::Family<prometheus::Gauge>& bytes_;
  prometheus::Family<prometheus::Gauge>& admitted_;
  prometheus::Family<prometheus::Gauge>& expired_;
  Mutex mu_;  // guards the members below
  std::map<std::string, absl::Time> updated_ ABSL_GUARDED_BY(mu_);          // by job
  std::map<std::string, std::set<std::string>> tables_ ABSL_GUARDED_BY(mu_);  // by job
};

}  // namespace fulcrum

#endif  // FULCRUM_SERVER_TABLE_GAUGES_H_
