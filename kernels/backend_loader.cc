#include "kernels/backend_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/plugin.h"

namespace fulcrum {
namespace kernels {
namespace {

struct Plugin {
  const FulcrumCudaPluginTable* table = nullptr;
  std::string error;
};

// Why the table at `path` cannot be used ("" when it can).
std::string CheckTable(const std::string& path, const FulcrumCudaPluginTable* table) {
  if (table == nullptr) return absl::StrCat(path, ": its plugin table is null");
  if (table->abi_version != FULCRUM_CUDA_PLUGIN_ABI_VERSION || table->table_size != sizeof(FulcrumCudaPluginTable)) {
    return absl::StrCat(path, ": plugin ABI version ", table->abi_version, " (table of ", table->table_size,
                        " bytes), this worker needs version ", FULCRUM_CUDA_PLUGIN_ABI_VERSION, " (",
                        sizeof(FulcrumCudaPluginTable), " bytes): install the plugin built with this worker");
  }
  if (table->backend_interface == nullptr ||
      std::string(table->backend_interface) != FULCRUM_BACKEND_INTERFACE) {
    return absl::StrCat(path, ": built against another Backend interface (kernels/backend.h ",
                        table->backend_interface == nullptr ? "unknown" : table->backend_interface,
                        ", this worker's ", FULCRUM_BACKEND_INTERFACE,
                        "): a stale plugin; install the one built with this worker");
  }
  if (table->device_count == nullptr || table->create_backend == nullptr) {
    return absl::StrCat(path, ": its plugin table lacks entry points");
  }
  return "";
}

std::string ExecutableDir() {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return ".";
  std::string path(exe, n);
  return path.substr(0, path.rfind('/'));
}

// Loaded once; never unloaded (backends created by it may live until exit).
const Plugin& LoadPlugin() {
  static Plugin plugin;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> tried;
    for (const std::string& path : CudaPluginCandidates()) {
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        tried.push_back(dlerror());
        continue;
      }
      auto entry = reinterpret_cast<decltype(&FulcrumCudaPlugin)>(dlsym(handle, "FulcrumCudaPlugin"));
      if (entry == nullptr) {
        tried.push_back(absl::StrCat(path, ": not a Fulcrum CUDA plugin of ABI version ",
                                     FULCRUM_CUDA_PLUGIN_ABI_VERSION, " (no FulcrumCudaPlugin table)"));
        continue;
      }
      const FulcrumCudaPluginTable* table = entry();
      std::string refused = CheckTable(path, table);
      if (refused.empty()) {
        plugin.table = table;
        return;
      }
      tried.push_back(refused);
    }
    plugin.error = absl::StrCat("no CUDA backend plugin (", absl::StrJoin(tried, "; "), ")");
  });
  return plugin;
}

// Whether the CUDA driver's library loads. The plugin's runtime opens
// libcuda.so.1 by that name, so without it no GPU can be used; and loading
// the plugin maps cuBLAS, about 150 MB resident that dlclose never gives
// back (measured on a machine without a GPU). --device auto asks this first.
absl::Status CudaDriverLoads() {
  static const std::string error = [] {
    if (dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr) return std::string();  // kept for the plugin
    const char* why = dlerror();
    return std::string(why != nullptr ? why : "libcuda.so.1 does not load");
  }();
  if (error.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("no CUDA driver (", error, ")"));
}

}  // namespace

std::vector<std::string> CudaPluginCandidates() {
  if (const char* env = std::getenv("FULCRUM_CUDA_PLUGIN"); env != nullptr && *env) return {env};
  std::string dir = ExecutableDir();
  return {absl::StrCat(dir, "/libfulcrum_kernels_cuda.so"), absl::StrCat(dir, "/../lib/libfulcrum_kernels_cuda.so")};
}

absl::StatusOr<int> CudaDeviceCount() {
  const Plugin& plugin = LoadPlugin();
  if (plugin.table == nullptr) return absl::UnavailableError(plugin.error);
  char error[512] = {0};
  int count = plugin.table->device_count(error, sizeof(error));
  if (count < 0) return absl::UnavailableError(absl::StrCat("no usable CUDA driver: ", error));
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> LoadCudaBackend(int device) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (device < 0 || device >= *count) {
    return absl::UnavailableError(absl::StrCat("no CUDA device ", device, " (", *count, " present)"));
  }
  char error[512] = {0};
  Backend* backend = LoadPlugin().table->create_backend(device, error, sizeof(error));
  if (backend == nullptr) return absl::UnavailableError(absl::StrCat("cuda:", device, ": ", error));
  return std::unique_ptr<Backend>(backend);
}

absl::StatusOr<BackendChoice> MakeBackend(const std::string& device) {
  BackendChoice choice;
  if (device == "cpu") {
    choice.backend = MakeCpuBackend();
    choice.explanation = "--device cpu";
    return choice;
  }
  if (device == "auto") {
    // Without a driver the plugin is not loaded at all (CudaDriverLoads).
    absl::Status driver = CudaDriverLoads();
    absl::StatusOr<std::unique_ptr<Backend>> cuda = driver.ok() ? LoadCudaBackend(0) : driver;
    if (cuda.ok()) {
      choice.backend = std::move(*cuda);
      choice.explanation = absl::StrCat("--device auto: using GPU ", choice.backend->Name());
    } else {
      choice.backend = MakeCpuBackend();
      choice.explanation = absl::StrCat("--device auto: using the CPU because ", cuda.status().message());
    }
    return choice;
  }
  int index = 0;
  if (device == "cuda" || (device.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(device.substr(5), &index))) {
    auto cuda = LoadCudaBackend(index);
    if (!cuda.ok()) return cuda.status();
    choice.backend = std::move(*cuda);
    choice.explanation = absl::StrCat("--device ", device);
    return choice;
  }
  return absl::InvalidArgumentError(absl::StrCat("--device must be auto, cpu, cuda or cuda:N (got \"", device, "\")"));
}

}  // namespace kernels
}  // namespace fulcrum
