// Which ggml devices a model offloads to, and llama.cpp's RPC backend (remote
// devices served by `pydflash rpc-server` or llama.cpp's rpc-server).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ggml-backend.h"

namespace pydflash {

// One ggml device, as `pydflash.backends()` shows it.
struct DeviceInfo {
    std::string name;  // "CPU", "CUDA0", "RPC0"
    std::string description;
    std::string type;     // "cpu", "gpu", "igpu", "accel"
    std::string backend;  // registry name: "CPU", "CUDA", "RPC[127.0.0.1:50052]"
    size_t memory_free = 0;
    size_t memory_total = 0;
};

std::vector<DeviceInfo> list_devices();

// Connects to each "host:port" and registers its devices once per process;
// ModelLoadError when a server cannot be reached.
std::vector<ggml_backend_dev_t> rpc_devices(const std::vector<std::string>& endpoints);

// The NULL-terminated device list for llama_model_params::devices, or an
// empty vector for llama.cpp's own default choice. Once any RPC server is
// registered (process-wide in ggml), every model gets an explicit list so that
// a model without `rpc_servers` never offloads to another model's servers.
std::vector<ggml_backend_dev_t> offload_devices(const std::vector<std::string>& rpc_endpoints);

bool rpc_available();

// Serves this machine's CPU backend to RPC clients until the process ends.
void serve_rpc(const std::string& endpoint, int n_threads, const std::string& cache_dir);

}  // namespace pydflash
