// The RocksDB store after a disk error: writes fail while the disk does,
// and work again once it is fixed, without reopening the store.
#include "common/kv_store.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

// `chattr +i` makes the folder immutable (even to root): RocksDB cannot
// create files in it, as on a disk gone read-only.
bool Immutable(const std::string& dir, bool on) {
  return std::system(absl::StrCat("chattr ", on ? "+i " : "-i ", dir, " 2>/dev/null").c_str()) == 0;
}

TEST(KvStoreTest, WritesWorkAgainOnceADiskErrorPasses) {
  std::string pattern = absl::StrCat(testing::TempDir(), "/kv-store.XXXXXX");
  ASSERT_NE(mkdtemp(pattern.data()), nullptr);
  const std::string dir = pattern;
  auto store = OpenRocksDbStore(dir + "/db");
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Write({{"a", "1"}}, {}).ok());
  if (!Immutable(dir + "/db", true)) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "chattr +i does not work here (not root, or the file system has no immutable flag)";
  }
  // A batch past the memtable makes RocksDB open new files: refused now.
  const std::string big(4 << 20, 'x');
  absl::Status failed;
  for (int i = 0; i < 4 && failed.ok(); ++i) failed = (*store)->Write({{absl::StrCat("big", i), big}}, {});
  const bool fixed = Immutable(dir + "/db", false);
  ASSERT_TRUE(fixed);
  if (failed.ok()) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "RocksDB wrote into the immutable folder: no error to recover from";
  }
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  const absl::Status again = (*store)->Write({{"after", "2"}}, {});
  EXPECT_TRUE(again.ok()) << "the store did not resume after the error passed: " << again;
  auto entries = (*store)->Scan("after");
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(entries->size(), 1u);
  store->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fulcrum
