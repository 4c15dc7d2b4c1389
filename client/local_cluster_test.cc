// The local cluster's bookkeeping: `fulcrum local down` signals only the
// processes that are still the cluster's, never another process that took a
// recorded pid after the cluster's process exited.
#include "client/local_cluster.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace fulcrum {
namespace {

TEST(LocalClusterTest, DownLeavesAProcessThatReusedARecordedPidAlone) {
  char dir_template[] = "/tmp/local_cluster_test_XXXXXX";
  const char* dir = mkdtemp(dir_template);
  ASSERT_NE(dir, nullptr);
  // Stands in for an unrelated process that now has server-0's pid.
  const pid_t stranger = fork();
  ASSERT_GE(stranger, 0);
  if (stranger == 0) {
    pause();
    _exit(0);
  }
  {
    std::ofstream file(absl::StrCat(dir, "/cluster.json"));
    file << "{\"scheduler\": \"127.0.0.1:1\", \"dir\": \"" << dir << "\", \"processes\": ["
         << "{\"role\": \"server\", \"id\": \"server-0\", \"pid\": " << stranger << "}]}";
  }
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Open(dir);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const absl::Status down = (*cluster)->Down(absl::Milliseconds(200));
  EXPECT_TRUE(down.ok()) << down;
  EXPECT_EQ(kill(stranger, 0), 0) << "local down signalled a process that is not the cluster's";
  int status = 0;
  EXPECT_EQ(waitpid(stranger, &status, WNOHANG), 0) << "it exited";
  EXPECT_EQ((*cluster)->Signal("server-0", SIGKILL).code(), absl::StatusCode::kNotFound);
  kill(stranger, SIGKILL);
  waitpid(stranger, nullptr, 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fulcrum
