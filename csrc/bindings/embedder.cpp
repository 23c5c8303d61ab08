// Embedder: the target's pooled (or per-token) hidden states as a numpy array.
#include "embedder.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.h"

namespace py = pybind11;

namespace pydflash::bindings {

void register_embedder(py::module_& m) {
    py::class_<Embedder>(m, "Embedder", "A context of the target model that outputs embeddings.")
        .def(py::init<std::shared_ptr<Model>, int32_t, int32_t, const std::string&>(), py::arg("model"),
             py::arg("n_ctx"), py::arg("n_threads") = 0, py::arg("pooling") = "",
             py::call_guard<py::gil_scoped_release>())
        .def(
            "embed",
            [](Embedder& self, const std::vector<llama_token>& tokens) {
                std::vector<float> v;
                {
                    py::gil_scoped_release nogil;
                    v = self.embed(tokens);
                }
                const auto n_embd = static_cast<py::ssize_t>(self.n_embd());
                const auto rows = static_cast<py::ssize_t>(v.size()) / n_embd;
                py::array_t<float> arr({rows, n_embd});
                std::copy(v.begin(), v.end(), arr.mutable_data());
                return arr;
            },
            py::arg("tokens"), "float32 array (1, n_embd) pooled, or (len(tokens), n_embd) with pooling 'none'.")
        .def_property_readonly("n_embd", &Embedder::n_embd)
        .def_property_readonly("n_ctx", &Embedder::n_ctx)
        .def_property_readonly("pooling", &Embedder::pooling);
}

}  // namespace pydflash::bindings
