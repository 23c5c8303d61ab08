#include "context_pair.h"

#include <pybind11/stl.h>

#include <sstream>

#include "bindings.h"

namespace py = pybind11;
using release = py::call_guard<py::gil_scoped_release>;

namespace pydflash::bindings {
namespace {

std::string repr(const StepResult& r) {
    std::ostringstream os;
    os << "StepResult(tokens=[";
    for (size_t i = 0; i < r.tokens.size(); ++i) os << (i ? ", " : "") << r.tokens[i];
    os << "], n_drafted=" << r.n_drafted << ", n_accepted=" << r.n_accepted << ", n_past=" << r.n_past
       << ", t_draft_ms=" << r.t_draft_ms << ", t_verify_ms=" << r.t_verify_ms
       << ", t_inject_ms=" << r.t_inject_ms << ")";
    return os.str();
}

}  // namespace

void register_context_pair(py::module_& m) {
    py::class_<StepResult>(m, "StepResult", "One speculative step (immutable).")
        .def_readonly("tokens", &StepResult::tokens, "New tokens: accepted drafts, then the target's own.")
        .def_readonly("drafted", &StepResult::drafted, "The block the drafter proposed.")
        .def_readonly("n_drafted", &StepResult::n_drafted)
        .def_readonly("n_accepted", &StepResult::n_accepted)
        .def_readonly("n_past", &StepResult::n_past)
        .def_readonly("t_draft_ms", &StepResult::t_draft_ms)
        .def_readonly("t_verify_ms", &StepResult::t_verify_ms)
        .def_readonly("t_inject_ms", &StepResult::t_inject_ms)
        .def_readonly("t_sample_ms", &StepResult::t_sample_ms)
        .def("__repr__", &repr);

    py::class_<ContextPair>(m, "ContextPair")
        .def(py::init([](std::shared_ptr<Model> target, std::shared_ptr<Model> drafter, uint32_t n_ctx,
                         uint32_t n_batch, uint32_t n_ubatch, int32_t n_threads, int32_t draft_max) {
                 return std::make_unique<ContextPair>(std::move(target), std::move(drafter),
                                                      PairParams{n_ctx, n_batch, n_ubatch, n_threads, draft_max});
             }),
             py::arg("target"), py::arg("drafter").none(true), py::arg("n_ctx") = 4096,
             py::arg("n_batch") = 512, py::arg("n_ubatch") = 512, py::arg("n_threads") = 0,
             py::arg("draft_max") = -1, release())
        .def("prefill", &ContextPair::prefill, py::arg("tokens"), release())
        .def("step", &ContextPair::step, py::arg("draft_max") = -1, py::arg("draft") = py::none(), release())
        .def("set_sampling",
             [](ContextPair& self, float temperature, int32_t top_k, float top_p, uint64_t seed) {
                 self.set_sampling(SamplingParams{temperature, top_k, top_p, seed});
             },
             py::arg("temperature") = 0.0f, py::arg("top_k") = 0, py::arg("top_p") = 1.0f,
             py::arg("seed") = 0, release())
        .def("reset", &ContextPair::reset, release())
        .def("close", &ContextPair::close, release())
        .def("tokens", &ContextPair::tokens)
        .def_property_readonly("closed", &ContextPair::closed)
        .def_property_readonly("has_drafter", &ContextPair::has_drafter)
        .def_property_readonly("n_past", &ContextPair::n_past)
        .def_property_readonly("n_ctx", &ContextPair::n_ctx)
        .def_property_readonly("n_batch", [](const ContextPair& s) { return s.params().n_batch; })
        .def_property_readonly("block_size", &ContextPair::block_size)
        .def_property_readonly("max_draft", &ContextPair::max_draft)
        .def_property_readonly("default_draft_max", &ContextPair::default_draft_max)
        .def_property_readonly("has_pending", &ContextPair::has_pending)
        .def_property_readonly("target_layer_ids", [](const ContextPair& s) { return s.spec().target_layer_ids; })
        .def_property_readonly("mask_token", [](const ContextPair& s) { return s.spec().mask_token; });
}

}  // namespace pydflash::bindings
