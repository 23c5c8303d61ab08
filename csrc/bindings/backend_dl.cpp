// ggml's dynamic backends (csrc/backend_dl.h): load them from the package folder,
// and report what loaded.
#include "../backend_dl.h"

#include <pybind11/stl.h>

#include "bindings.h"

namespace py = pybind11;

namespace pydflash::bindings {

namespace {

py::list report_to_list(const std::vector<BackendLoad>& report) {
    py::list out;
    for (const auto& b : report) {
        py::dict d;
        d["name"] = text(b.name);
        d["path"] = text(b.path);
        d["loaded"] = b.loaded;
        d["n_devices"] = b.n_devices;
        d["error"] = text(b.error);
        out.append(d);
    }
    return out;
}

}  // namespace

void register_backend_dl(py::module_& m) {
    m.def("dynamic_backends", &dynamic_backends,
          "True when ggml's backends are separate modules loaded at run time (the CUDA build).");
    m.def(
        "load_backends",
        [](const std::string& dir) {
            std::vector<BackendLoad> report;
            {
                py::gil_scoped_release release;
                report = load_backends(dir);
            }
            return report_to_list(report);
        },
        py::arg("dir"),
        "Load the ggml backend modules in `dir` (once; later calls return the first report). "
        "Each entry: name, path, loaded, n_devices, error.");
    m.def(
        "backend_load_report", [] { return report_to_list(backend_load_report()); },
        "What load_backends found: name, path, loaded, n_devices, error per backend.");
    m.def(
        "loaded_backends",
        [] {
            py::list out;
            for (const auto& b : backend_load_report())
                if (b.loaded && b.n_devices > 0) out.append(text(b.name));
            return out;
        },
        "Names of the registered backends that have at least one device (\"CPU\", \"CUDA\").");
    m.def(
        "backend_load_errors",
        [] {
            py::dict out;
            for (const auto& b : backend_load_report())
                if (!b.error.empty()) out[text(b.name)] = text(b.error);
            return out;
        },
        "Backend name -> why it did not load or has no device (e.g. no NVIDIA driver).");
}

}  // namespace pydflash::bindings
