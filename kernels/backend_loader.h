// Picks and creates the compute backend for --device auto|cpu|cuda[:N].
// The CUDA backend lives in a plugin loaded with dlopen on first use.
#ifndef FULCRUM_KERNELS_BACKEND_LOADER_H_
#define FULCRUM_KERNELS_BACKEND_LOADER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace fulcrum {
namespace kernels {

struct BackendChoice {
  std::unique_ptr<Backend> backend;
  std::string explanation;  // why this backend, for the log
};

// Where the plugin is looked for: $FULCRUM_CUDA_PLUGIN if set, else
// libfulcrum_kernels_cuda.so in the executable's folder, then ../lib.
std::vector<std::string> CudaPluginCandidates();

// Loads the plugin and creates a backend on `device`. UNAVAILABLE with the
// reason when there is no plugin, no driver or no such device.
absl::StatusOr<std::unique_ptr<Backend>> LoadCudaBackend(int device);

// The number of CUDA devices the plugin sees; UNAVAILABLE with the reason.
absl::StatusOr<int> CudaDeviceCount();

// "cpu": the CPU backend. "cuda" / "cuda:N": that GPU or an error.
// "auto": GPU 0 when a plugin, a driver and a device are present, else the
// CPU backend, with the reason in `explanation`. INVALID_ARGUMENT for any
// other spelling.
absl::StatusOr<BackendChoice> MakeBackend(const std::string& device);

}  // namespace kernels
}  // namespace fulcrum

#endif  // FULCRUM_KERNELS_BACKEND_LOADER_H_
