#include "model.h"

#include <pybind11/stl.h>

#include "bindings.h"
#include "drafter.h"
#include "rollback.h"

namespace py = pybind11;
using release = py::call_guard<py::gil_scoped_release>;

namespace pydflash::bindings {

void register_model(py::module_& m) {
    m.def(
        "inspect_gguf",
        [](const std::string& path) {
            GgufInfo info;
            {
                py::gil_scoped_release nogil;
                info = inspect_gguf(path);
            }
            py::dict d;
            d["architecture"] = text(info.architecture);
            d["metadata"] = text_map(info.metadata);
            d["tensor_names"] = text_list(info.tensor_names);
            return d;
        },
        py::arg("path"), "Read a GGUF header (no weights): architecture, metadata, tensor names.");

    m.def(
        "layer_input_architectures",
        []() {
            const auto& a = layer_input_architectures();
            return std::vector<std::string>(a.begin(), a.end());
        },
        "Target architectures whose llama.cpp graph records layer inputs (DFlash's features).");

    py::class_<Model, std::shared_ptr<Model>>(m, "Model")
        .def_static(
            "load",
            [](const std::string& path, const ModelParams& params, const std::string& role) {
                return Model::load(path, params, role);
            },
            py::arg("path"), py::arg("params") = ModelParams{}, py::arg("role") = "target", release())
        .def_static("load_drafter", &load_drafter, py::arg("path"), py::arg("params") = ModelParams{}, release(),
                    "Load a DFlash drafter; its GGUF header is checked before any weights load.")
        .def_property_readonly("path", &Model::path)
        .def_property_readonly("architecture", [](const Model& self) { return text(self.architecture()); })
        .def_property_readonly("n_embd", &Model::n_embd)
        .def_property_readonly("n_layer", &Model::n_layer)
        .def_property_readonly("n_layer_nextn", &Model::n_layer_nextn)
        .def_property_readonly("n_vocab", &Model::n_vocab)
        .def_property_readonly("n_ctx_train", &Model::n_ctx_train)
        .def_property_readonly("n_params", &Model::n_params)
        .def_property_readonly("size_bytes", &Model::size_bytes)
        .def_property_readonly("is_recurrent", &Model::is_recurrent)
        .def_property_readonly("is_hybrid", &Model::is_hybrid)
        .def_property_readonly("description", [](const Model& self) { return text(self.description()); })
        .def_property_readonly("metadata", [](const Model& self) { return text_map(self.info().metadata); })
        .def_property_readonly("bos", &Model::bos)
        .def_property_readonly("eos", &Model::eos)
        .def_property_readonly("add_bos", &Model::add_bos)
        .def("tokenize", &Model::tokenize, py::arg("text"), py::arg("add_special") = true,
             py::arg("parse_special") = false, release())
        // bytes: a token boundary may split a UTF-8 character; Python decodes
        .def(
            "detokenize",
            [](const Model& self, const std::vector<llama_token>& tokens, bool remove_special, bool unparse_special) {
                std::string s;
                {
                    py::gil_scoped_release nogil;
                    s = self.detokenize(tokens, remove_special, unparse_special);
                }
                return py::bytes(s);
            },
            py::arg("tokens"), py::arg("remove_special") = false, py::arg("unparse_special") = false)
        .def(
            "token_to_piece",
            [](const Model& self, llama_token t, bool special) { return py::bytes(self.token_to_piece(t, special)); },
            py::arg("token"), py::arg("special") = false)
        .def(
            "token_pieces",
            [](const Model& self, const std::vector<llama_token>& tokens, bool special) {
                std::vector<std::string> pieces;
                {
                    py::gil_scoped_release nogil;
                    pieces = self.token_pieces(tokens, special);
                }
                py::list out(pieces.size());
                for (size_t i = 0; i < pieces.size(); ++i) out[i] = py::bytes(pieces[i]);
                return out;
            },
            py::arg("tokens"), py::arg("special") = false, "token_to_piece of each token, in one call.")
        .def("is_eog", &Model::is_eog, py::arg("token"))
        .def(
            "eog_tokens", [](const Model& self) { return self.eog_tokens(); },
            "Every end-of-generation token (llama_vocab_is_eog), ascending.")
        .def(
            "fim_tokens",
            [](const Model& self) {
                py::dict d;
                for (const auto& [part, t] : self.fim_tokens()) d[py::str(part)] = t;
                return d;
            },
            "The FIM tokens the vocabulary has (llama_vocab_fim_*), by part: pre, suf, mid, pad, rep, sep.")
        .def(
            "drafter_incompatibility",
            [](const Model& self, const Model& drafter) { return text(drafter_incompatibility(self, drafter)); },
            py::arg("drafter"), "Why `drafter` cannot drive this target model, or '' when it can.")
        .def_property_readonly(
            "drafter_description", [](const Model& self) { return text(drafter_description(self)); },
            "A `dflash` drafter's kind and variant from its header ('dflash2 (selector top-k 4)'); '' otherwise.")
        .def("rollback_for_drafting", &auto_rollback_for_drafting, release(),
             "How a DFlash pair on this target removes rejected tokens (rollback 'auto'): "
             "'kv-trim', 'recurrent-planes' or 'checkpoint'. Asks llama.cpp with a small context.")
        .def("__repr__", [](const Model& self) {
            return text("<pydflash._core.Model " + self.architecture() + " '" + self.path() + "'>");
        });
}

}  // namespace pydflash::bindings
