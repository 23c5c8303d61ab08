// Maps the core's typed C++ errors to the exception classes of pydflash.errors
// (defined in Python so that they can also derive from ValueError etc.).
#include <exception>
#include <new>

#include "bindings.h"
#include "errors.h"

namespace py = pybind11;

namespace pydflash::bindings {
namespace {

void raise_as(const char* name, const char* what) {
    py::object cls = py::module_::import("pydflash.errors").attr(name);
    PyErr_SetObject(cls.ptr(), text(what).ptr());
}

}  // namespace

py::str text(const std::string& s) {
    PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
    if (o == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::str>(o);
}

py::dict text_map(const std::map<std::string, std::string>& m) {
    py::dict d;
    for (const auto& [k, v] : m) d[text(k)] = text(v);
    return d;
}

py::list text_list(const std::vector<std::string>& v) {
    py::list l;
    for (const auto& s : v) l.append(text(s));
    return l;
}

void register_errors(py::module_&) {
    py::register_exception_translator([](std::exception_ptr p) {
        if (!p) return;
        try {
            std::rethrow_exception(p);
        } catch (const ModelLoadError& e) {
            raise_as("ModelLoadError", e.what());
        } catch (const DraftCompatibilityError& e) {
            raise_as("DraftCompatibilityError", e.what());
        } catch (const ContextLimitError& e) {
            raise_as("ContextLimitError", e.what());
        } catch (const Interrupted& e) {
            // a signal handler (Ctrl-C) already set KeyboardInterrupt: keep it
            if (!PyErr_Occurred()) raise_as("GenerationInterrupted", e.what());
        } catch (const RollbackError& e) {
            raise_as("RollbackError", e.what());
        } catch (const DecodeError& e) {
            raise_as("DecodeError", e.what());
        } catch (const ChatTemplateError& e) {
            raise_as("ChatTemplateError", e.what());
        } catch (const GrammarError& e) {
            raise_as("GrammarError", e.what());
        } catch (const Error& e) {
            raise_as("PyDFlashError", e.what());
        } catch (const InvalidArgument& e) {
            PyErr_SetObject(PyExc_ValueError, text(e.what()).ptr());
        }
        // anything else (std::bad_alloc, std::exception) falls through to
        // pybind11's own translators: MemoryError, RuntimeError
    });
}

}  // namespace pydflash::bindings
