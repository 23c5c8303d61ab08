// ggml's dynamic backends (the CUDA build): load the backend modules shipped in
// the package folder before llama.cpp enumerates devices, and remember what
// loaded and why something did not. In the default (static) build the backends
// are linked in; the same calls then only report them.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace pydflash {

struct BackendLoad {
    std::string name;      // ggml's registry name ("CPU", "CUDA"), or the file's family ("cuda") if it did not load
    std::string path;      // the module file tried; empty for a backend linked into the build
    bool loaded = false;   // registered with ggml
    size_t n_devices = 0;  // devices it brought (a CUDA backend without a GPU/driver has none)
    std::string error;     // why it did not load, or why it has no device; empty otherwise
};

// True when built with GGML_BACKEND_DL (backends are separate modules).
bool dynamic_backends();

// Load every ggml backend module found in `dir` (libggml-<name>[-<variant>].so;
// for a family with variants, the best-scoring one, as ggml does), with llama.cpp's
// log captured into the report instead of stderr; then initialise llama.cpp.
// Must run before anything else touches llama.cpp. Idempotent: later calls return
// the first report (with today's device counts). In the static build: initialises
// llama.cpp and reports the linked backends.
std::vector<BackendLoad> load_backends(const std::string& dir);

// The report of load_backends with today's device counts, plus any backend registered
// since (or the registered backends if load_backends was not called).
std::vector<BackendLoad> backend_load_report();

}  // namespace pydflash
