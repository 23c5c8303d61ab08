#include "backend.h"

#include <pybind11/stl.h>

#include "bindings.h"
#include "llama.h"

namespace py = pybind11;

namespace pydflash::bindings {

void register_backend(py::module_& m) {
    m.def("drain_logs", [] {
        py::list out;
        for (const auto& [level, line] : drain_logs()) out.append(py::make_tuple(level, text(line)));
        return out;
    }, "Take queued llama.cpp log lines as (level, text) pairs.");
    m.def("set_log_level", &set_log_level, py::arg("level"),
          "Queue llama.cpp messages at or above this ggml level (1 debug .. 4 error, 5 none).");
    m.def("log_level", &log_level);
    m.def("devices", &devices, "The ggml backend devices as (name, description) pairs.");
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
