// The CUDA plugin boundary: a plugin whose table has another ABI version, or
// that was built against another kernels/backend.h, or that has no table (an
// older plugin) is refused with a message saying so, and none of its entry
// points is called. Each test runs in its own process (the loader loads once).
#include <dlfcn.h>
#include <stdlib.h>

#include <fstream>
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

// Whether a library whose path contains `name` is mapped into this process.
bool Mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (absl::StrContains(line, name)) return true;
  }
  return false;
}

// Loading the plugin maps cuBLAS (about 150 MB resident, never given back),
// so --device auto on a machine without a CUDA driver does not load it.
TEST(PluginLoaderTest, AutoWithoutACudaDriverLeavesThePluginUnloaded) {
  if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL); driver != nullptr) {
    dlclose(driver);
    GTEST_SKIP() << "this machine has a CUDA driver (libcuda.so.1 loads)";
  }
  ASSERT_EQ(unsetenv("FULCRUM_CUDA_PLUGIN"), 0);
  absl::StatusOr<BackendChoice> choice = MakeBackend("auto");
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_TRUE(absl::StrContains(choice->explanation, "using the CPU because no CUDA driver")) << choice->explanation;
  EXPECT_FALSE(Mapped("libfulcrum_kernels_cuda")) << "the plugin was loaded";
  EXPECT_FALSE(Mapped("libcublas")) << "cuBLAS was loaded";
  // Asked for by name, the plugin is still loaded and says why it cannot run.
  absl::StatusOr<BackendChoice> cuda = MakeBackend("cuda");
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kernels
}  // namespace fulcrum
