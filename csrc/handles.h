// RAII owners for every llama.cpp / ggml handle the core holds.
#pragma once

#include <memory>

#include "gguf.h"
#include "llama.h"

namespace pydflash {

struct ModelDeleter {
    void operator()(llama_model* m) const noexcept { llama_model_free(m); }
};
struct ContextDeleter {
    void operator()(llama_context* c) const noexcept { llama_free(c); }
};
struct BatchDeleter {
    void operator()(llama_batch_ext* b) const noexcept { llama_batch_ext_free(b); }
};
struct GgufDeleter {
    void operator()(gguf_context* g) const noexcept { gguf_free(g); }
};

using ModelPtr = std::unique_ptr<llama_model, ModelDeleter>;
using ContextPtr = std::unique_ptr<llama_context, ContextDeleter>;
using BatchPtr = std::unique_ptr<llama_batch_ext, BatchDeleter>;
using GgufPtr = std::unique_ptr<gguf_context, GgufDeleter>;

}  // namespace pydflash
