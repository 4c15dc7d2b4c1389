// The plugin's C entry points (see plugin.h). Nothing here may throw or
// abort across the C boundary: failures come back as -1 / nullptr with a
// message.

#include "kernels/cuda/plugin.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "kernels/cuda/cuda_backend.h"

namespace {

void CopyMessage(const std::string& message, char* error, size_t error_size) {
  if (error == nullptr || error_size == 0) return;
  std::snprintf(error, error_size, "%s", message.c_str());
}

int DeviceCount(char* error, size_t error_size) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // No driver, an old driver or no device: "no GPU", not a crash.
    (void)cudaGetLastError();
    CopyMessage(std::string(cudaGetErrorString(status)) + " (" + cudaGetErrorName(status) + ")", error,
                error_size);
    return -1;
  }
  return count;
}

fulcrum::kernels::Backend* CreateBackend(int device, char* error, size_t error_size) {
  try {
    auto backend = fulcrum::kernels::cuda::CudaBackend::Create(device);
    if (!backend.ok()) {
      CopyMessage(backend.status().ToString(), error, error_size);
      return nullptr;
    }
    return backend->release();
  } catch (const std::exception& e) {  // e.g. std::bad_alloc from the host side
    CopyMessage(std::string("creating the CUDA backend failed: ") + e.what(), error, error_size);
    return nullptr;
  }
}

}  // namespace

extern "C" const FulcrumCudaPluginTable* FulcrumCudaPlugin() {
  static const FulcrumCudaPluginTable table = {FULCRUM_CUDA_PLUGIN_ABI_VERSION, sizeof(FulcrumCudaPluginTable),
                                               FULCRUM_BACKEND_INTERFACE, &DeviceCount, &CreateBackend};
  return &table;
}
