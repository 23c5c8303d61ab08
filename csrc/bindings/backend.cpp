#include "backend.h"

#include <pybind11/stl.h>

#include "bindings.h"
#include "devices.h"
#include "llama.h"
#include "threads.h"

namespace py = pybind11;

namespace pydflash::bindings {

void register_backend(py::module_& m) {
    m.def(
        "drain_logs",
        [] {
            py::list out;
            for (const auto& [level, line] : drain_logs()) out.append(py::make_tuple(level, text(line)));
            return out;
        },
        "Take queued llama.cpp log lines as (level, text) pairs.");
    m.def("init_numa", &init_numa, py::arg("strategy"), py::call_guard<py::gil_scoped_release>(),
          "llama.cpp's NUMA placement, once per process (0 off .. 4 mirror); the strategy in force.");
    m.def("set_log_level", &set_log_level, py::arg("level"),
          "Queue llama.cpp messages at or above this ggml level (1 debug .. 4 error, 5 none).");
    m.def("log_level", &log_level);
    m.def(
        "devices",
        [] {
            py::list out;
            for (const auto& d : list_devices()) {
                py::dict row;
                row["name"] = text(d.name);
                row["description"] = text(d.description);
                row["type"] = d.type;
                row["backend"] = text(d.backend);
                row["memory_free"] = d.memory_free;
                row["memory_total"] = d.memory_total;
                out.append(row);
            }
            return out;
        },
        "The ggml devices: name, description, type, backend, memory_free, memory_total.");
    m.def("rpc_available", &rpc_available, "Whether this build has ggml's RPC backend.");
    m.def("serve_rpc", &serve_rpc, py::arg("endpoint"), py::arg("n_threads") = 0, py::arg("cache_dir") = "",
          py::call_guard<py::gil_scoped_release>(),
          "Serve this machine's CPU backend to RPC clients at host:port; never returns.");
    m.def("release_compute_threads", &release_compute_threads,
          "Free the calling thread's OpenMP worker pool (ggml's CPU threads); False where ggml runs without libgomp.");
    m.def("system_info", [] {
        ensure_backend();
        return std::string(llama_print_system_info());
    });
    m.def("supports_gpu_offload", [] {
        ensure_backend();
        return llama_supports_gpu_offload();
    });
}

}  // namespace pydflash::bindings
