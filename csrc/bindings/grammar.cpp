// Grammars: GBNF checking and llama.cpp's JSON-schema-to-GBNF converter. A pair
// takes its grammar through ContextPair.set_grammar (bindings/context_pair.cpp).
#include "grammar.h"

#include <pybind11/stl.h>

#include "bindings.h"

namespace py = pybind11;

namespace pydflash::bindings {

void register_grammar(py::module_& m) {
    m.def("grammar_error", &grammar_error, py::arg("gbnf"),
          "Why a GBNF grammar does not parse, or '' when it does (nothing is printed).");
    m.def("json_schema_to_grammar", &json_schema_to_gbnf, py::arg("schema_json"),
          "llama.cpp's GBNF for a JSON schema (given as JSON text); ValueError if it cannot convert.",
          py::call_guard<py::gil_scoped_release>());
}

}  // namespace pydflash::bindings
