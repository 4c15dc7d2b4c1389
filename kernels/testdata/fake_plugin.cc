// Plugins the CUDA backend loader must refuse (kernels/plugin_loader_test.cc),
// one per FAKE_PLUGIN_* variant the build defines. Their entry points must
// never be called: they abort if they are.
#include <cstdlib>

#include "kernels/cuda/plugin.h"

#if defined(FAKE_PLUGIN_no_table)
// A plugin of ABI version 1: it exported its version, not a table.
extern "C" int FulcrumCudaPluginAbiVersion() { return 1; }
#else
namespace {

int DeviceCount(char*, size_t) { std::abort(); }
fulcrum::kernels::Backend* Create(int, char*, size_t) { std::abort(); }

}  // namespace

extern "C" const FulcrumCudaPluginTable* FulcrumCudaPlugin() {
#if defined(FAKE_PLUGIN_stale_abi)
  static const FulcrumCudaPluginTable table = {FULCRUM_CUDA_PLUGIN_ABI_VERSION + 1, sizeof(FulcrumCudaPluginTable),
                                               FULCRUM_BACKEND_INTERFACE, &DeviceCount, &Create};
#else  // stale_interface: the table is right, the Backend it was built against is not
  static const FulcrumCudaPluginTable table = {FULCRUM_CUDA_PLUGIN_ABI_VERSION, sizeof(FulcrumCudaPluginTable),
                                               "0123456789abcdef", &DeviceCount, &Create};
#endif
  return &table;
}
#endif
