// The coupled sampler's noise (coupled.h), for tests and for anyone who wants to
// replay a verify="coupled" generation outside the engine.
#include "coupled.h"

#include <pybind11/stl.h>

#include <vector>

#include "bindings.h"

namespace py = pybind11;

namespace pydflash::bindings {

void register_coupled(py::module_& m) {
    m.def("philox4x32", &philox4x32, py::arg("counter"), py::arg("key"),
          "Philox4x32-10 of a 4-word counter under a 2-word key (the coupled noise's generator).");
    m.def(
        "coupled_gumbel",
        [](uint64_t seed, llama_pos pos, const std::vector<llama_token>& tokens) {
            std::vector<double> out;
            out.reserve(tokens.size());
            for (llama_token t : tokens) out.push_back(coupled_gumbel(seed, pos, t));
            return out;
        },
        py::arg("seed"), py::arg("pos"), py::arg("tokens"),
        "verify='coupled''s Gumbel noise of each token at absolute position pos under seed.");
}

}  // namespace pydflash::bindings
