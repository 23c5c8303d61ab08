// pydflash._core: the private extension module. Translates types, releases the
// GIL around heavy calls, maps C++ errors to Python exceptions. No logic here.
#include "bindings.h"

#ifndef PYDFLASH_VERSION
#define PYDFLASH_VERSION "dev"
#endif

PYBIND11_MODULE(_core, m) {
    m.doc() = "pydflash private extension module (use the pydflash package instead)";
    m.attr("__version__") = PYDFLASH_VERSION;
    pydflash::bindings::register_errors(m);
    pydflash::bindings::register_backend(m);
    pydflash::bindings::register_backend_dl(m);
    pydflash::bindings::register_options(m);
    pydflash::bindings::register_model(m);
    pydflash::bindings::register_context_pair(m);
    pydflash::bindings::register_chat(m);
    pydflash::bindings::register_grammar(m);
    pydflash::bindings::register_coupled(m);
    pydflash::bindings::register_embedder(m);
    pydflash::bindings::register_feature_capture(m);
}
