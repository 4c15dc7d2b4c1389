// The boundary of the CUDA backend plugin (libfulcrum_kernels_cuda.so). The
// worker never links CUDA: it dlopens the plugin (see
// kernels/backend_loader.h) because libcublasLt's static TLS breaks the
// small-stack threads of prometheus-cpp's HTTP server when linked in.
//
// The plugin exports one C symbol, FulcrumCudaPlugin, returning a versioned
// table. The loader takes a plugin only if its table has the ABI version and
// size it expects and was built against the same kernels/backend.h (a
// fingerprint of that header, computed by the build): the backend object
// crosses the boundary as a C++ class, and a plugin built against another
// version of the interface would call the wrong virtual functions.
#ifndef FULCRUM_KERNELS_CUDA_PLUGIN_H_
#define FULCRUM_KERNELS_CUDA_PLUGIN_H_

#include <cstddef>
#include <cstdint>

namespace fulcrum {
namespace kernels {
class Backend;
}  // namespace kernels
}  // namespace fulcrum

// Bumped when this table changes.
#define FULCRUM_CUDA_PLUGIN_ABI_VERSION 2

// The build defines it (kernels/CMakeLists.txt): a hash of kernels/backend.h.
#ifndef FULCRUM_BACKEND_INTERFACE
#error "FULCRUM_BACKEND_INTERFACE must be defined by the build"
#endif

extern "C" {

struct FulcrumCudaPluginTable {
  uint32_t abi_version;           // FULCRUM_CUDA_PLUGIN_ABI_VERSION
  uint32_t table_size;            // sizeof(FulcrumCudaPluginTable)
  const char* backend_interface;  // FULCRUM_BACKEND_INTERFACE the plugin was built with
  // Number of CUDA devices, or -1 with a message in `error` (e.g. no driver:
  // "CUDA driver version is insufficient for CUDA runtime version").
  int (*device_count)(char* error, size_t error_size);
  // A new backend on `device`, owned by the caller (delete through the
  // virtual destructor), or nullptr with a message in `error`.
  fulcrum::kernels::Backend* (*create_backend)(int device, char* error, size_t error_size);
};

// The plugin's table; never null, valid for the life of the process.
const FulcrumCudaPluginTable* FulcrumCudaPlugin();

}  // extern "C"

#endif  // FULCRUM_KERNELS_CUDA_PLUGIN_H_
