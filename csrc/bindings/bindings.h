// One registration function per concept; module.cpp calls them in order.
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <string>
#include <vector>

namespace pydflash::bindings {

// Text that came from a model file (metadata, names, llama.cpp's log and
// error messages quoting them) need not be UTF-8: decode with U+FFFD for bad
// bytes instead of letting a UnicodeDecodeError replace the real error.
pybind11::str text(const std::string& s);
pybind11::dict text_map(const std::map<std::string, std::string>& m);
pybind11::list text_list(const std::vector<std::string>& v);

void register_errors(pybind11::module_& m);
void register_backend(pybind11::module_& m);
void register_backend_dl(pybind11::module_& m);
void register_options(pybind11::module_& m);
void register_model(pybind11::module_& m);
void register_context_pair(pybind11::module_& m);
void register_chat(pybind11::module_& m);
void register_grammar(pybind11::module_& m);
void register_coupled(pybind11::module_& m);
void register_embedder(pybind11::module_& m);
void register_feature_capture(pybind11::module_& m);

}  // namespace pydflash::bindings
