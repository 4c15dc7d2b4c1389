// The C entry points of the CUDA backend plugin (libfulcrum_kernels_cuda.so).
// The worker never links CUDA: it dlopens the plugin (see
// kernels/backend_loader.h) because libcublasLt's static TLS breaks the
// small-stack threads of prometheus-cpp's HTTP server when linked in.
#ifndef FULCRUM_KERNELS_CUDA_PLUGIN_H_
#define FULCRUM_KERNELS_CUDA_PLUGIN_H_

#include <cstddef>

namespace fulcrum {
namespace kernels {
class Backend;
}  // namespace kernels
}  // namespace fulcrum

extern "C" {

// Version of this ABI; the loader refuses a plugin with another one.
int FulcrumCudaPluginAbiVersion();

// Number of CUDA devices, or -1 with a message in `error` (e.g. no driver:
// "CUDA driver version is insufficient for CUDA runtime version").
int FulcrumCudaDeviceCount(char* error, size_t error_size);

// A new backend on `device`, owned by the caller (delete through the virtual
// destructor), or nullptr with a message in `error`.
fulcrum::kernels::Backend* FulcrumCreateCudaBackend(int device, char* error, size_t error_size);

}  // extern "C"

#define FULCRUM_CUDA_PLUGIN_ABI_VERSION 1

#endif  // FULCRUM_KERNELS_CUDA_PLUGIN_H_
