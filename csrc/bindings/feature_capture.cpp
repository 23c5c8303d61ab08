// FeatureCapture: a target's layer inputs for whole sequences, as numpy arrays.
#include "feature_capture.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>

#include "bindings.h"

namespace py = pybind11;

namespace pydflash::bindings {

void register_feature_capture(py::module_& m) {
    py::class_<FeatureCapture>(m, "FeatureCapture",
                               "A context of the target that records the inputs of chosen layers (DFlash's "
                               "features) for whole sequences.")
        .def(py::init<std::shared_ptr<Model>, std::vector<int32_t>, int32_t, int32_t, int32_t, int32_t>(),
             py::arg("model"), py::arg("layer_ids"), py::arg("n_ctx"), py::arg("n_batch") = 512,
             py::arg("n_threads") = 0, py::arg("n_seq") = 1, py::call_guard<py::gil_scoped_release>())
        .def(
            "capture",
            [](FeatureCapture& self, const std::vector<llama_token>& tokens, int32_t top_k) {
                CapturedSequence c;
                {
                    py::gil_scoped_release nogil;
                    c = self.capture(tokens, top_k);
                }
                const auto rows = static_cast<py::ssize_t>(tokens.size());
                py::array_t<float> feats({rows, static_cast<py::ssize_t>(self.width())});
                std::copy(c.features.begin(), c.features.end(), feats.mutable_data());
                py::array_t<int32_t> top({rows, static_cast<py::ssize_t>(top_k)});
                std::copy(c.top.begin(), c.top.end(), top.mutable_data());
                py::array_t<float> top_logits({rows, static_cast<py::ssize_t>(top_k)});
                std::copy(c.top_logits.begin(), c.top_logits.end(), top_logits.mutable_data());
                return py::make_tuple(feats, top, top_logits);
            },
            py::arg("tokens"), py::arg("top_k") = 0,
            "(features float32 (len(tokens), width), top ids int32 (len(tokens), top_k), their logits float32) for "
            "one sequence from position 0; top_k 0: no logits are computed.")
        .def(
            "generate",
            [](FeatureCapture& self, const std::vector<std::vector<llama_token>>& prompts, int32_t max_new) {
                std::vector<GeneratedSequence> gen;
                {
                    py::gil_scoped_release nogil;
                    gen = self.generate(prompts, max_new);
                }
                py::list out;
                for (const auto& g : gen) {
                    const auto rows = static_cast<py::ssize_t>(g.features.size() / static_cast<size_t>(self.width()));
                    py::array feats(py::dtype("float16"), {rows, static_cast<py::ssize_t>(self.width())});
                    std::memcpy(feats.mutable_data(), g.features.data(), g.features.size() * sizeof(ggml_fp16_t));
                    py::array_t<int32_t> reply(static_cast<py::ssize_t>(g.reply.size()));
                    std::copy(g.reply.begin(), g.reply.end(), reply.mutable_data());
                    out.append(py::make_tuple(reply, feats));
                }
                return out;
            },
            py::arg("prompts"), py::arg("max_new"),
            "[(greedy reply int32, features float16 (len(prompt) + len(reply), width))] per prompt: the target's "
            "replies (up to max_new tokens; the end-of-generation token that ends one is not kept), n_seq at a "
            "time, with every position's features from the passes that generate them.")
        .def_property_readonly("n_ctx", &FeatureCapture::n_ctx)
        .def_property_readonly("n_seq", &FeatureCapture::n_seq)
        .def_property_readonly("width", &FeatureCapture::width)
        .def_property_readonly("layer_ids", &FeatureCapture::layer_ids);
}

}  // namespace pydflash::bindings
