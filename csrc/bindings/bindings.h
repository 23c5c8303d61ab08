// One registration function per concept; module.cpp calls them in order.
#pragma once

#include <pybind11/pybind11.h>

namespace pydflash::bindings {

void register_errors(pybind11::module_& m);
void register_backend(pybind11::module_& m);
void register_model(pybind11::module_& m);
void register_context_pair(pybind11::module_& m);
void register_chat(pybind11::module_& m);

}  // namespace pydflash::bindings
