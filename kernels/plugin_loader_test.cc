// The CUDA plugin boundary: a plugin whose table has another ABI version, or
// that was built against another kernels/backend.h, or that has no table (an
// older plugin) is refused with a message saying so, and none of its entry
// points is called. Each test runs in its own process (the loader loads once).
#include <stdlib.h>

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/backend_loader.h"

namespace fulcrum {
namespace kernels {
namespace {

void ExpectRefused(const std::string& library, const std::vector<std::string>& reasons) {
  const std::string path = std::string(FULCRUM_LIB_DIR) + "/" + library;
  ASSERT_EQ(setenv("FULCRUM_CUDA_PLUGIN", path.c_str(), 1), 0);
  absl::StatusOr<int> count = CudaDeviceCount();
  ASSERT_FALSE(count.ok()) << "a mismatched plugin was taken";
  EXPECT_EQ(count.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(count.status().message(), path)) << count.status();
  for (const std::string& reason : reasons) {
    EXPECT_TRUE(absl::StrContains(count.status().message(), reason)) << count.status();
  }
  // --device auto falls back to the CPU, saying why.
  absl::StatusOr<BackendChoice> choice = MakeBackend("auto");
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_TRUE(absl::StrContains(choice->explanation, "using the CPU")) << choice->explanation;
  EXPECT_EQ(MakeBackend("cuda").status().code(), absl::StatusCode::kUnavailable);
}

TEST(PluginLoaderTest, APluginOfAnotherAbiVersionIsRefused) {
  ExpectRefused("libfake_plugin_stale_abi.so", {"ABI version", "install the plugin built with this worker"});
}

TEST(PluginLoaderTest, APluginBuiltAgainstAnotherBackendInterfaceIsRefused) {
  ExpectRefused("libfake_plugin_stale_interface.so", {"another Backend interface", "0123456789abcdef", "stale"});
}

TEST(PluginLoaderTest, AnOlderPluginWithoutTheTableIsRefused) {
  ExpectRefused("libfake_plugin_no_table.so", {"not a Fulcrum CUDA plugin", "no FulcrumCudaPlugin table"});
}

}  // namespace
}  // namespace kernels
}  // namespace fulcrum
