// The option structs that cross the binding (PairParams, SamplingParams,
// DraftControl, ModelParams) and the core's choice lists. Each struct is
// built by field name from its C++ defaults, never by position: the Python
// layer reads its defaults from `_core.PairParams()` etc. and checks values
// with the core's own `validate()`.
#include <pybind11/stl.h>

#include <string>

#include "bindings.h"
#include "model.h"
#include "ngram.h"
#include "options.h"
#include "pair_params.h"
#include "sampler.h"

namespace py = pybind11;

namespace pydflash::bindings {
namespace {

// Keyword constructor from the C++ defaults (an unknown name is a TypeError)
// and a repr that lists every field, for a struct whose fields are bound
// with def_readwrite / def_property.
template <class T>
void def_fields_api(py::class_<T>& cls, const char* name) {
    cls.def(py::init([name](const py::kwargs& kw) {
        py::object obj = py::cast(T{});
        py::object props = py::type::of(obj).attr("__dict__");
        py::object property = py::module_::import("builtins").attr("property");
        for (const auto& [key, value] : kw) {
            if (!props.contains(key) || !py::isinstance(props[key], property)) {
                throw py::type_error(std::string(name) + "() got an unexpected keyword argument '" +
                                     py::str(key).cast<std::string>() + "'");
            }
            py::setattr(obj, key, value);
        }
        return obj.cast<T>();
    }));
    cls.def("__repr__", [name](const py::object& self) {
        py::object property = py::module_::import("builtins").attr("property");
        std::string out = std::string(name) + "(";
        bool first = true;
        for (const auto& item : py::type::of(self).attr("__dict__").attr("items")()) {
            const auto kv = item.cast<py::tuple>();
            if (!py::isinstance(kv[1], property)) continue;
            out +=
                (first ? "" : ", ") + kv[0].cast<std::string>() + "=" + py::repr(self.attr(kv[0])).cast<std::string>();
            first = false;
        }
        return out + ")";
    });
}

// A def_readwrite, with its doc, for each field of an X-macro list (fields.h) on `cls`, a
// py::class_<S>; `plain` collects their names, the class's _plain_fields, from which
// tools/write_stub.py writes their lines in _core.pyi.
#define PYDFLASH_BIND_FIELD(type, name, init, doc) \
    cls.def_readwrite(#name, &S::name, doc);       \
    plain.append(#name);

void def_sampling_fields(py::class_<SamplingParams>& cls) {
    using S = SamplingParams;
    py::list plain;
    PYDFLASH_SAMPLING_FIELDS(PYDFLASH_BIND_FIELD)
    cls.attr("_plain_fields") = py::tuple(plain);
}

void def_draft_control_fields(py::class_<DraftControl>& cls) {
    using S = DraftControl;
    py::list plain;
    PYDFLASH_DRAFT_CONTROL_FIELDS(PYDFLASH_BIND_FIELD)
    cls.attr("_plain_fields") = py::tuple(plain);
}

}  // namespace

void register_options(py::module_& m) {
    py::dict choices;
    for (const auto& [option, names] : option_choices()) choices[py::str(option)] = py::tuple(py::cast(names));
    m.attr("CHOICES") = choices;

    py::class_<NgramParams> ngram(m, "NgramParams", "llama.cpp's n-gram drafters' settings (--spec-ngram-*).");
    ngram.def_readwrite("mod_n_match", &NgramParams::mod_n_match)
        .def_readwrite("mod_n_min", &NgramParams::mod_n_min)
        .def_readwrite("mod_n_max", &NgramParams::mod_n_max)
        .def_readwrite("simple_size_n", &NgramParams::simple_size_n)
        .def_readwrite("simple_size_m", &NgramParams::simple_size_m)
        .def_readwrite("map_k_size_n", &NgramParams::map_k_size_n)
        .def_readwrite("map_k_size_m", &NgramParams::map_k_size_m)
        .def_readwrite("map_k_min_hits", &NgramParams::map_k_min_hits)
        .def_readwrite("map_k4v_size_n", &NgramParams::map_k4v_size_n)
        .def_readwrite("map_k4v_size_m", &NgramParams::map_k4v_size_m)
        .def_readwrite("map_k4v_min_hits", &NgramParams::map_k4v_min_hits)
        .def("validate", &NgramParams::validate);
    def_fields_api(ngram, "NgramParams");
    m.attr("SPECULATIVE_TYPES") = py::tuple(py::cast(speculative_type_names()));
    m.attr("DEFAULT_DRAFT_WINDOW") = kDefaultDraftWindow;

    py::class_<PairParams> pair(m, "PairParams", "Options of a ContextPair, fixed at creation.");
    pair.def_readwrite("n_ctx", &PairParams::n_ctx)
        .def_readwrite("n_seq", &PairParams::n_seq)
        .def_readwrite("kv_unified", &PairParams::kv_unified)
        .def_readwrite("offload_kqv", &PairParams::offload_kqv)
        .def_readwrite("n_batch", &PairParams::n_batch)
        .def_readwrite("n_ubatch", &PairParams::n_ubatch)
        .def_readwrite("n_threads", &PairParams::n_threads)
        .def_readwrite("n_threads_batch", &PairParams::n_threads_batch)
        .def_readwrite("rope_freq_base", &PairParams::rope_freq_base)
        .def_readwrite("draft_max", &PairParams::draft_max)
        .def_readwrite("rollback", &PairParams::rollback)
        .def_readwrite("flash_attn", &PairParams::flash_attn)
        .def_readwrite("type_k", &PairParams::type_k)
        .def_readwrite("type_v", &PairParams::type_v)
        .def_readwrite("draft_type_k", &PairParams::draft_type_k)
        .def_readwrite("draft_type_v", &PairParams::draft_type_v)
        .def_readwrite("draft_window", &PairParams::draft_window)
        .def_readwrite("speculative", &PairParams::speculative)
        .def_readwrite("ngram", &PairParams::ngram)
        .def("validate", &PairParams::validate, "ValueError naming the first bad value.");
    def_fields_api(pair, "PairParams");

    py::class_<SamplingParams> sampling(m, "SamplingParams", "How tokens are chosen and drafts verified.");
    def_sampling_fields(sampling);
    sampling.def_readwrite("logit_bias", &SamplingParams::logit_bias)
        .def_property(
            "verify", [](const SamplingParams& p) { return std::string(verify_name(p.verify)); },
            [](SamplingParams& p, const std::string& name) { p.verify = parse_verify(name); })
        .def("validate", &SamplingParams::validate, py::arg("n_vocab") = 0,
             "ValueError naming the first bad value (token ids against n_vocab when > 0).");
    def_fields_api(sampling, "SamplingParams");

    py::class_<DraftControl> control(m, "DraftControl", "Draft-length controls of one step.");
    def_draft_control_fields(control);
    control.def("validate", &DraftControl::validate);
    def_fields_api(control, "DraftControl");

    py::class_<ModelParams> model(m, "ModelParams", "How a model is loaded and where its layers go.");
    model.def_readwrite("n_gpu_layers", &ModelParams::n_gpu_layers)
        .def_readwrite("use_mmap", &ModelParams::use_mmap)
        .def_readwrite("use_mlock", &ModelParams::use_mlock)
        .def_readwrite("main_gpu", &ModelParams::main_gpu)
        .def_readwrite("split_mode", &ModelParams::split_mode)
        .def_readwrite("tensor_split", &ModelParams::tensor_split)
        .def_readwrite("rpc_servers", &ModelParams::rpc_servers)
        .def_readwrite("load_mtp", &ModelParams::load_mtp)
        .def("validate", &ModelParams::validate);
    def_fields_api(model, "ModelParams");
}

}  // namespace pydflash::bindings
