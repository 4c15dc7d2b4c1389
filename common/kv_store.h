// A small durable key-value store: the scheduler keeps its state (jobs, shard
// maps, membership epochs) in it so that it can restart, and servers will keep
// checkpoints in it. Two implementations: RocksDB on disk and an in-memory map
// for tests. Thread-safe.
#ifndef FULCRUM_COMMON_KV_STORE_H_
#define FULCRUM_COMMON_KV_STORE_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fulcrum {

class KvStore {
 public:
  virtual ~KvStore() = default;

  // Writes every (key, value) of `puts` and deletes every key of `deletes`
  // atomically and durably (synced before returning). A write larger than
  // the store's in-memory buffer leaves no copy of itself there (RocksDB:
  // it is flushed to its file before returning).
  virtual absl::Status Write(std::vector<std::pair<std::string, std::string>> puts,
                             const std::vector<std::string>& deletes) = 0;
  // Every (key, value) whose key starts with `prefix`, in key order.
  virtual absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(const std::string& prefix) = 0;

  // Bytes the store holds in memory beside what it has written to its files
  // (RocksDB's memtables; 0 for a store that lives in memory).
  virtual int64_t BufferedBytes() { return 0; }

  absl::Status Put(const std::string& key, const std::string& value) { return Write({{key, value}}, {}); }
  absl::Status Delete(const std::string& key) { return Write({}, {key}); }
};

// Opens (creating if needed) a RocksDB database in `dir`. UNAVAILABLE naming
// the folder when it cannot be opened (e.g. another process holds its lock).
absl::StatusOr<std::unique_ptr<KvStore>> OpenRocksDbStore(const std::string& dir);

// A store that lives in memory only.
std::unique_ptr<KvStore> NewMemoryStore();

}  // namespace fulcrum

#endif  // FULCRUM_COMMON_KV_STORE_H_
