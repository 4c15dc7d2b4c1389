#include "common/kv_store.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <filesystem>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/sync.h"

namespace fulcrum {
namespace {

// The memtable's size: the scheduler's records are small and few, so a
// 1 MiB memtable is flushed every few hundred jobs instead of growing to
// RocksDB's default 64 MiB (which read as memory growing with every
// finished job in the soak).
constexpr size_t kWriteBufferBytes = size_t{1} << 20;

class RocksDbStore final : public KvStore {
 public:
  RocksDbStore(std::string dir, rocksdb::Options options, std::unique_ptr<rocksdb::DB> db)
      : dir_(std::move(dir)), options_(std::move(options)), db_(std::move(db)) {}

  absl::Status Write(std::vector<std::pair<std::string, std::string>> puts,
                     const std::vector<std::string>& deletes) override {
    rocksdb::WriteBatch batch;
    for (auto& [key, value] : puts) {
      batch.Put(key, value);
      std::string().swap(value);  // the batch has its copy: a checkpoint is held twice, not three times
    }
    for (const auto& key : deletes) batch.Delete(key);
    rocksdb::WriteOptions options;
    options.sync = true;
    // After a failed write (a disk error) RocksDB refuses every write for
    // good (a fatal background error): the next write opens the database
    // again, so one passing error does not stop the store until the process
    // restarts.
    if (stopped_.load()) RETURN_IF_ERROR(Reopen());
    ReaderMutexLock lock(&mu_);
    rocksdb::Status status = db_->Write(options, &batch);
    if (!status.ok()) {
      stopped_ = true;
      return absl::UnavailableError(absl::StrCat("RocksDB write: ", status.ToString()));
    }
    // A batch past the memtable's size (a checkpoint) is flushed to its file
    // before returning: the memtable's copy of it goes now, while the caller
    // still counts the write's memory, not later in the background. The
    // write is durable already (synced to the log), so a failed flush only
    // leaves that to the background.
    if (batch.GetDataSize() > kWriteBufferBytes) {
      if (rocksdb::Status flushed = db_->Flush(rocksdb::FlushOptions()); !flushed.ok()) {
        FLOG(WARNING) << "RocksDB flush after a write of " << batch.GetDataSize()
                      << " bytes failed (the background flush will do it): " << flushed.ToString();
      }
    }
    return absl::OkStatus();
  }

  int64_t BufferedBytes() override {
    ReaderMutexLock lock(&mu_);
    uint64_t bytes = 0;
    return db_->GetIntProperty(rocksdb::DB::Properties::kCurSizeAllMemTables, &bytes)
               ? static_cast<int64_t>(bytes)
               : 0;
  }

  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(const std::string& prefix) override {
    std::vector<std::pair<std::string, std::string>> entries;
    ReaderMutexLock lock(&mu_);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      entries.emplace_back(it->key().ToString(), it->value().ToString());
    }
    if (!it->status().ok()) return absl::DataLossError(absl::StrCat("RocksDB scan: ", it->status().ToString()));
    return entries;
  }

 private:
  // Closes the database and opens it again (its log replayed): what clears
  // RocksDB's error state once the disk works again.
  absl::Status Reopen() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    if (!stopped_.load()) return absl::OkStatus();  // another writer reopened it
    if (db_ != nullptr) {
      db_->Close().PermitUncheckedError();  // closing a database in error may fail; it is reopened anyway
      db_.reset();
    }
    rocksdb::DB* db = nullptr;
    rocksdb::Status status = rocksdb::DB::Open(options_, dir_, &db);
    if (!status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("RocksDB write: the store stopped after an earlier write error "
                       "and cannot be opened again yet: ",
                       status.ToString()));
    }
    db_.reset(db);
    stopped_ = false;
    FLOG(INFO) << "RocksDB in " << dir_ << " opened again after an earlier write error";
    return absl::OkStatus();
  }
  const std::string dir_;
  const rocksdb::Options options_;
  Mutex mu_;  // writes, reads and scans share it; reopening takes it alone
  std::unique_ptr<rocksdb::DB> db_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopped_{false};  // a write failed: reopen before the next
};

class MemoryStore final : public KvStore {
 public:
  absl::Status Write(std::vector<std::pair<std::string, std::string>> puts,
                     const std::vector<std::string>& deletes) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, value] : puts) data_[key] = std::move(value);
    for (const auto& key : deletes) data_.erase(key);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(const std::string& prefix) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<std::string, std::string>> entries;
    for (auto it = data_.lower_bound(prefix); it != data_.end() && absl::StartsWith(it->first, prefix); ++it) {
      entries.emplace_back(*it);
    }
    return entries;
  }

 private:
  std::mutex mu_;  // guards data_
  std::map<std::string, std::string> data_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvStore>> OpenRocksDbStore(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot create the state folder ", dir, ": ", error.message()));
  }
  rocksdb::Options options;
  options.create_if_missing = true;
  options.write_buffer_size = kWriteBufferBytes;
  rocksdb::DB* db = nullptr;
  rocksdb::Status status = rocksdb::DB::Open(options, dir, &db);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot open the state database in ", dir, ": ", status.ToString()));
  }
  return std::unique_ptr<KvStore>(new RocksDbStore(dir, options, std::unique_ptr<rocksdb::DB>(db)));
}

std::unique_ptr<KvStore> NewMemoryStore() { return std::make_unique<MemoryStore>(); }

}  // namespace fulcrum
