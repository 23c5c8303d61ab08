#include "context_pair.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "bindings.h"
#include "errors.h"

namespace py = pybind11;
using release = py::call_guard<py::gil_scoped_release>;

namespace pydflash::bindings {
namespace {

// Python's main thread: the only one where it runs signal handlers. Read from
// threading, not taken at load time: a worker thread may import us first.
unsigned long g_main_thread = 0;

// Polled by the core during decodes (GIL released): lets Ctrl-C stop a long
// prefill or verification. PyErr_CheckSignals leaves KeyboardInterrupt set.
bool python_signal_pending() {
    if (PyThread_get_thread_ident() != g_main_thread) return false;
    py::gil_scoped_acquire gil;
    return PyErr_CheckSignals() != 0;
}

std::string repr(const StepResult& r) {
    std::ostringstream os;
    os << "StepResult(tokens=[";
    for (size_t i = 0; i < r.tokens.size(); ++i) os << (i ? ", " : "") << r.tokens[i];
    os << "], seq=" << r.seq << ", draft_max=" << r.draft_max << ", n_drafted=" << r.n_drafted
       << ", n_accepted=" << r.n_accepted << ", n_past=" << r.n_past << ", t_draft_ms=" << r.t_draft_ms
       << ", t_verify_ms=" << r.t_verify_ms << ", t_inject_ms=" << r.t_inject_ms << ")";
    return os.str();
}

std::string repr(const TokenLogprob& lp) {
    std::ostringstream os;
    os << "TokenLogprob(token=" << lp.token << ", logprob=" << lp.logprob << ", top=[";
    for (size_t i = 0; i < lp.top.size(); ++i)
        os << (i ? ", " : "") << "(" << lp.top[i].first << ", " << lp.top[i].second << ")";
    os << "])";
    return os.str();
}

}  // namespace

void register_context_pair(py::module_& m) {
    g_main_thread = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
    py::enum_<DraftKind>(m, "DraftKind", "Who drafted a step: llama.cpp's --spec-type kinds, or the caller.")
        .value("NONE", DraftKind::None)
        .value("NGRAM_SIMPLE", DraftKind::NgramSimple)
        .value("NGRAM_MAP_K", DraftKind::NgramMapK)
        .value("NGRAM_MAP_K4V", DraftKind::NgramMapK4v)
        .value("NGRAM_MOD", DraftKind::NgramMod)
        .value("NGRAM_CACHE", DraftKind::NgramCache)
        .value("DRAFT_MTP", DraftKind::DraftMtp)
        .value("DRAFT_DFLASH", DraftKind::DraftDFlash)
        .value("DRAFT_DSPARK", DraftKind::DraftDSpark)
        .value("EXTERNAL", DraftKind::External)
        .def_property_readonly(
            "spec_type", [](DraftKind k) { return draft_kind_name(k); },
            "llama.cpp's --spec-type name ('ngram-mod', 'draft-dflash', ...), 'external'; '' for NONE.");
    py::class_<TokenLogprob>(m, "TokenLogprob", "A new token's log-probability and the top tokens at its position.")
        .def_readonly("token", &TokenLogprob::token)
        .def_readonly("logprob", &TokenLogprob::logprob)
        .def_readonly("top", &TokenLogprob::top, "(token, logprob) pairs, most likely first.")
        .def("__repr__", py::overload_cast<const TokenLogprob&>(&repr));
    py::class_<StepResult>(m, "StepResult", "One speculative step (immutable).")
        .def_readonly("tokens", &StepResult::tokens, "New tokens: accepted drafts, then the target's own.")
        .def_readonly("drafted", &StepResult::drafted, "The block the drafter proposed.")
        .def_readonly("logprobs", &StepResult::logprobs, "One TokenLogprob per token (SamplingParams.logprobs).")
        .def_readonly("seq", &StepResult::seq, "The sequence this step advanced.")
        .def_readonly("n_batch_seqs", &StepResult::n_batch_seqs, "Sequences that shared this step's passes.")
        .def_readonly("error", &StepResult::error,
                      "Non-empty: this sequence failed alone (its grammar allows nothing more) and was reset.")
        .def_readonly("kind", &StepResult::kind, "Who drafted (DraftKind.NONE: nobody).")
        .def_property_readonly(
            "source", [](const StepResult& r) { return draft_kind_name(r.kind); },
            "Who drafted, by llama.cpp's name: 'draft-dflash', an n-gram type ('ngram-mod', ...), 'external'; '': "
            "nobody.")
        .def_readonly("draft_max", &StepResult::draft_max,
                      "The drafter block length this step asked for (0: none); an n-gram draft may be longer.")
        .def_readonly("n_drafted", &StepResult::n_drafted)
        .def_readonly("n_accepted", &StepResult::n_accepted)
        .def_readonly("n_past", &StepResult::n_past)
        .def_readonly("t_draft_ms", &StepResult::t_draft_ms)
        .def_readonly("t_verify_ms", &StepResult::t_verify_ms)
        .def_readonly("t_inject_ms", &StepResult::t_inject_ms)
        .def_readonly("t_sample_ms", &StepResult::t_sample_ms)
        .def_readonly("t_rollback_ms", &StepResult::t_rollback_ms,
                      "Removing rejected tokens from the target (checkpoint: save, restore and replay).")
        .def_property_readonly(
            "t_step_ms",
            [](const StepResult& r) {
                return r.t_draft_ms + r.t_verify_ms + r.t_inject_ms + r.t_sample_ms + r.t_rollback_ms;
            },
            "The step's time in the core: drafting, verifying, injecting, sampling and rolling back.")
        .def("__repr__", py::overload_cast<const StepResult&>(&repr));

    py::class_<Calibration>(m, "Calibration", "ContextPair.calibrate's timings (ms) per pass size.")
        .def_readonly("verify_rows", &Calibration::verify_rows, "Target pass sizes timed (rows).")
        .def_readonly("verify_ms", &Calibration::verify_ms, "Median ms of each target pass size.")
        .def_readonly("draft_rows", &Calibration::draft_rows, "Drafter block pass sizes timed (empty: no drafter).")
        .def_readonly("draft_ms", &Calibration::draft_ms, "Median ms of each drafter pass size.")
        .def_readonly("reps", &Calibration::reps)
        .def_readonly("seconds", &Calibration::seconds, "What the calibration took.");

    py::class_<SeqStep>(m, "SeqStep", "One sequence's part of ContextPair.step_batch.")
        .def(py::init([](int32_t seq, int32_t draft_max, int32_t draft_min, float draft_p_min,
                         const std::optional<std::vector<llama_token>>& draft, int32_t budget) {
                 SeqStep st;
                 st.seq = seq;
                 st.control.draft_max = draft_max;
                 st.control.draft_min = draft_min;
                 st.control.draft_p_min = draft_p_min;
                 st.control.budget = budget;
                 st.external = draft;
                 return st;
             }),
             py::arg("seq"), py::arg("draft_max") = -1, py::arg("draft_min") = 0, py::arg("draft_p_min") = 0.0f,
             py::arg("draft") = py::none(), py::arg("budget") = -1)
        .def_readonly("seq", &SeqStep::seq);

    py::class_<ContextPair>(m, "ContextPair")
        .def(py::init([](std::shared_ptr<Model> target, std::shared_ptr<Model> drafter, const PairParams& params) {
                 auto pair = std::make_unique<ContextPair>(std::move(target), std::move(drafter), params);
                 pair->set_interrupt_check(&python_signal_pending);
                 return pair;
             }),
             py::arg("target"), py::arg("drafter").none(true), py::arg("params") = PairParams{}, release())
        .def(
            "prefill",
            [](ContextPair& self, const std::vector<llama_token>& tokens, bool reuse, int32_t seq) {
                return prefill(self, seq, tokens, reuse);
            },
            py::arg("tokens"), py::arg("reuse") = false, py::arg("seq") = 0, release())
        .def("prefill_begin", &ContextPair::prefill_begin, py::arg("seq"), py::arg("tokens"), py::arg("reuse"),
             py::arg("defer") = false, release(),
             "Check a prompt for `seq`, keep its cached prefix (returns its length); nothing is decoded. With "
             "`defer`, the prompt's features wait for the sequence's next drafter pass, as a plain step's do.")
        .def("prefill_some", &ContextPair::prefill_some, py::arg("seqs"), py::arg("budget"), release(),
             "Evaluate at most `budget` more prompt tokens of these sequences in one target pass (ms).")
        .def("prefill_remaining", &ContextPair::prefill_remaining, py::arg("seq"), release())
        .def(
            "save_sequence",
            [](ContextPair& self, int32_t seq, const std::string& path) { save_sequence(self, seq, path); },
            py::arg("seq"), py::arg("path"), release(),
            "Write sequence `seq` (history, pending token, both contexts' state of it) to `path`.")
        .def(
            "load_sequence",
            [](ContextPair& self, int32_t seq, const std::string& path) { load_sequence(self, seq, path); },
            py::arg("seq"), py::arg("path"), release(),
            "Replace sequence `seq` with one saved by save_sequence (same models and settings).")
        .def(
            "step",
            [](ContextPair& self, int32_t draft_max, int32_t draft_min, float draft_p_min,
               const std::optional<std::vector<llama_token>>& draft, int32_t seq, int32_t budget) {
                DraftControl control;
                control.draft_max = draft_max;
                control.draft_min = draft_min;
                control.draft_p_min = draft_p_min;
                control.budget = budget;
                return step(self, seq, control, draft);
            },
            py::arg("draft_max") = -1, py::arg("draft_min") = 0, py::arg("draft_p_min") = 0.0f,
            py::arg("draft") = py::none(), py::arg("seq") = 0, py::arg("budget") = -1, release())
        .def("calibrate", &ContextPair::calibrate, py::arg("seq"), py::arg("max_rows"), py::arg("reps") = 3, release(),
             "Time target passes of 1..max_rows rows and drafter block passes in the empty sequence `seq` "
             "(median of `reps` each); leaves it empty.")
        .def("step_batch", &ContextPair::step_batch, py::arg("steps"), release(),
             "One step of several sequences in shared passes; a result per SeqStep, in order.")
        .def(
            "step_run",
            [](ContextPair& self, const SeqStep& st, int32_t n_steps, int32_t n_tokens, bool stop_at_eog) {
                return step_run(self, st, n_steps, n_tokens, stop_at_eog);
            },
            py::arg("step"), py::arg("n_steps"), py::arg("n_tokens"), py::arg("stop_at_eog"), release(),
            "Up to `n_steps` steps of one sequence in one call: stops after a failed step, at `n_tokens` "
            "tokens, after an end-of-generation token (`stop_at_eog`) and before the context is full.")
        .def("step_runs", &ContextPair::step_runs, py::arg("steps"), py::arg("n_steps"), py::arg("n_tokens"),
             py::arg("stop_at_eog"), release(),
             "step_run of several sequences stepping together, `n_tokens` one count per sequence: each "
             "drops out where it stops, the others go on. The results per sequence, in the order of `steps`.")
        .def(
            "score",
            [](ContextPair& self, const std::vector<llama_token>& tokens) {
                std::vector<float> v;
                {
                    py::gil_scoped_release nogil;
                    v = self.score(tokens);
                }
                const auto n = static_cast<py::ssize_t>(tokens.size());
                const auto n_vocab = static_cast<py::ssize_t>(v.size()) / std::max<py::ssize_t>(n, 1);
                py::array_t<float> arr({n, n_vocab});
                std::memcpy(arr.mutable_data(), v.data(), v.size() * sizeof(float));
                return arr;
            },
            py::arg("tokens"), "Target logits (n, n_vocab) for every position; leaves the pair reset.")
        .def(
            "set_sampling",
            [](ContextPair& self, const SamplingParams& params, int32_t seq) { self.set_sampling(seq, params); },
            py::arg("params"), py::arg("seq") = 0, release())
        .def(
            "set_grammar",
            [](ContextPair& self, const std::string& gbnf, bool lazy, const std::vector<std::string>& trigger_patterns,
               const std::vector<llama_token>& trigger_tokens, const std::vector<llama_token>& prefill, int32_t seq) {
                GrammarSpec spec;
                spec.gbnf = gbnf;
                spec.lazy = lazy;
                spec.trigger_patterns = trigger_patterns;
                spec.trigger_tokens = trigger_tokens;
                spec.prefill = prefill;
                self.set_grammar(seq, spec);
            },
            py::arg("gbnf"), py::arg("lazy") = false, py::arg("trigger_patterns") = std::vector<std::string>{},
            py::arg("trigger_tokens") = std::vector<llama_token>{}, py::arg("prefill") = std::vector<llama_token>{},
            py::arg("seq") = 0, release(),
            "The grammar the next tokens follow, from its start ('' for none); lazy: only after a trigger "
            "(a regex on the output, or a token); prefill: tokens it consumes first. ValueError if it does not "
            "parse.")
        .def(
            "has_grammar", [](const ContextPair& self, int32_t seq) { return self.sequence(seq).grammar; },
            py::arg("seq") = 0)
        .def("check", &ContextPair::check, py::arg("control"),
             "ValueError unless the draft controls suit this pair (draft_max within the block).")
        .def(
            "memory",
            [](const ContextPair& self) {
                std::vector<MemoryRow> rows;
                {
                    py::gil_scoped_release nogil;  // the pair's lock, as tokens()
                    rows = self.memory();
                }
                py::list out;
                for (const auto& r : rows) {
                    out.append(py::make_tuple(r.role, r.buffer, r.model, r.context, r.compute));
                }
                return out;
            },
            "llama.cpp's memory breakdown: (role, buffer type, model, context, compute) bytes.")
        .def(
            "reset",
            [](ContextPair& self, std::optional<int32_t> seq) {
                if (seq) {
                    self.reset(*seq);
                } else {
                    self.reset();
                }
            },
            py::arg("seq") = py::none(), release(), "Clear one sequence (or, with none given, all).")
        .def("interrupt", &ContextPair::interrupt,
             "Stop the running (or the next) decode; that call raises GenerationInterrupted.")
        .def("clear_interrupt", &ContextPair::clear_interrupt, "Withdraw an interrupt no decode has consumed yet.")
        .def("close", &ContextPair::close, release())
        .def("_inject_fault", &ContextPair::inject_fault, py::arg("site"), py::arg("after_calls") = 0,
             "Tests only: the (after_calls + 1)-th later call at site ('target_decode', 'drafter_decode', "
             "'memory_remove'; 'none' disarms) fails as if llama.cpp had failed.")
        // these wait for the pair's lock, which a prefill or a step holds: without the GIL,
        // so that the other Python threads (a server's event loop) run meanwhile
        .def("tokens", &ContextPair::tokens, py::arg("seq") = 0, release())
        .def_property_readonly("closed", &ContextPair::closed)
        .def_property_readonly("has_drafter", [](const ContextPair& s) { return s.info().draft.has_drafter; })
        .def(
            "n_past", [](const ContextPair& s, int32_t seq) { return s.sequence(seq).n_past; }, py::arg("seq") = 0)
        .def(
            "n_deferred", [](const ContextPair& s, int32_t seq) { return s.sequence(seq).n_deferred; },
            py::arg("seq") = 0,
            "Rows of `seq` whose target features wait for its drafter's next pass (deferred injection).")
        .def(
            "n_cached", [](const ContextPair& s, int32_t seq) { return s.sequence(seq).n_cached; }, py::arg("seq") = 0,
            "Prompt tokens the last prefill of `seq` took from the cache (prefill(reuse=True)).")
        .def_property_readonly("n_seq", [](const ContextPair& s) { return s.info().params.n_seq; })
        .def_property_readonly("n_ctx", [](const ContextPair& s) { return s.info().params.n_ctx; })
        .def_property_readonly(
            "n_ctx_seq", [](const ContextPair& s) { return s.info().params.n_ctx_seq(); },
            "One sequence's context: n_ctx / n_seq (n_ctx with kv_unified).")
        .def_property_readonly("n_batch", [](const ContextPair& s) { return s.info().params.n_batch; })
        .def_property_readonly("block_size", [](const ContextPair& s) { return s.info().draft.block_size; })
        .def_property_readonly("max_draft", [](const ContextPair& s) { return s.info().draft.max_draft; })
        .def_property_readonly(
            "drafter_kind", [](const ContextPair& s) { return s.info().draft.kind; },
            "'dflash', 'dflash2', 'dspark' or 'mtp' ('' without a drafter).")
        .def_property_readonly(
            "drafter_description", [](const ContextPair& s) { return s.info().draft.description; },
            "The drafter's kind and variant, e.g. 'dflash2 (selector top-k 4)', 'dflash (d2t vocabulary 200)'.")
        .def_property_readonly(
            "draft_sources", [](const ContextPair& s) { return s.info().draft.sources; },
            "The draft sources in the order a step tries them (llama.cpp's priority): EXTERNAL, the n-gram "
            "types, the model drafter.")
        .def_property_readonly(
            "draft_vocab", [](const ContextPair& s) { return s.info().draft.spec.n_vocab_draft; },
            "Rows of a reduced drafter vocabulary (d2t); 0: the full vocabulary.")
        .def_property_readonly("default_draft_max",
                               [](const ContextPair& s) { return s.info().draft.default_draft_max; })
        .def_property_readonly("draft_pass_rows", [](const ContextPair& s) { return s.info().draft.pass_rows; })
        .def_property_readonly(
            "draft_window", [](const ContextPair& s) { return s.info().draft.window; },
            "Positions before a block the drafter sees (its window); 0: the whole context.")
        .def(
            "has_pending", [](const ContextPair& s, int32_t seq) { return s.sequence(seq).pending; },
            py::arg("seq") = 0)
        .def_property_readonly("target_layer_ids",
                               [](const ContextPair& s) { return s.info().draft.spec.target_layer_ids; })
        .def_property_readonly("mask_token", [](const ContextPair& s) { return s.info().draft.spec.mask_token; })
        .def_property_readonly(
            "rollback", [](const ContextPair& s) { return std::string(rollback_name(s.info().rollback)); },
            "How rejected tokens leave the target: kv-trim, recurrent-planes or checkpoint.")
        .def_property_readonly(
            "n_rs_seq", [](const ContextPair& s) { return s.info().n_rs_seq; },
            "Recurrent-state planes of the target (the deepest partial rollback).");
}

}  // namespace pydflash::bindings
