// Grammars: GBNF checking and llama.cpp's JSON-schema-to-GBNF converter. A pair
// takes its grammar through ContextPair.set_grammar (bindings/context_pair.cpp).
#include "grammar.h"
#include "grammar_limits.h"

#include <pybind11/stl.h>

#include "bindings.h"

namespace py = pybind11;

namespace pydflash::bindings {

void register_grammar(py::module_& m) {
    py::dict limits;  // grammar_limits.h: what each refusal names
    limits["bytes"] = GrammarLimits::kBytes;
    limits["depth"] = GrammarLimits::kDepth;
    limits["rules"] = GrammarLimits::kRules;
    limits["elements"] = GrammarLimits::kElements;
    limits["stacks"] = GrammarLimits::kStacks;
    limits["json_depth"] = GrammarLimits::kJsonDepth;
    limits["schema_key_bytes"] = GrammarLimits::kKeyBytes;
    limits["schema_refs"] = GrammarLimits::kRefs;
    limits["pattern_depth"] = GrammarLimits::kPatternDepth;
    m.attr("GRAMMAR_LIMITS") = limits;
    m.def("grammar_error", &grammar_error, py::arg("gbnf"),
          "Why a GBNF grammar does not parse, or '' when it does (nothing is printed); ValueError naming "
          "the limit when it is over one of GRAMMAR_LIMITS.",
          py::call_guard<py::gil_scoped_release>());
    m.def("json_schema_to_grammar", &json_schema_to_gbnf, py::arg("schema_json"),
          "llama.cpp's GBNF for a JSON schema (given as JSON text); ValueError if it cannot convert.",
          py::call_guard<py::gil_scoped_release>());
}

}  // namespace pydflash::bindings
