// Typed errors thrown by the C++ core; the binding layer maps each one to a
// Python exception class (see bindings/errors.cpp). No Python headers here.
#pragma once

#include <stdexcept>
#include <string>

namespace pydflash {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The file cannot be loaded: missing, not a file, not GGUF, truncated, corrupt,
// unknown architecture.
struct ModelLoadError : Error {
    using Error::Error;
};

// Both files load, but the drafter cannot drive this target.
struct DraftCompatibilityError : Error {
    using Error::Error;
};

// The request does not fit in the context window.
struct ContextLimitError : Error {
    using Error::Error;
};

// llama.cpp refused or failed a decode; the pair has been reset.
struct DecodeError : Error {
    using Error::Error;
};

// Rejected tokens could not be removed from the target's memory (llama.cpp
// refused a partial seq_rm, or a state checkpoint could not be saved or
// restored); the pair has been reset rather than continue from a wrong state.
struct RollbackError : DecodeError {
    using DecodeError::DecodeError;
};

// A decode was stopped by request (interrupt() or a signal); the pair was reset.
struct Interrupted : Error {
    using Error::Error;
};

// A chat template cannot be parsed or fails while rendering.
struct ChatTemplateError : Error {
    using Error::Error;
};

// The output cannot continue under the grammar (a lazy grammar whose triggered
// text does not fit it, or an end of generation it does not allow).
struct GrammarError : Error {
    using Error::Error;
};

// A bad argument (maps to ValueError).
struct InvalidArgument : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

}  // namespace pydflash
