// The target's hidden states as embeddings (llama-cpp-python's create_embedding):
// a context of its own, with embeddings on and a pooling type, so that the
// pair's caches are never touched.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "handles.h"
#include "model.h"

namespace pydflash {

class Embedder {
public:
    // `n_ctx`: the longest input (one ubatch: pooling needs the whole sequence in one
    // pass); `pooling`: "mean", "cls", "last", "none", or "" for the model's own
    // (mean when the GGUF names none, as for a generative model).
    Embedder(std::shared_ptr<Model> model, int32_t n_ctx, int32_t n_threads, const std::string& pooling);

    // Row-major floats: one row of n_embd per input (pooled) or per token ("none").
    std::vector<float> embed(const std::vector<llama_token>& tokens);

    int32_t n_embd() const { return model_->n_embd(); }
    int32_t n_ctx() const { return n_ctx_; }
    const std::string& pooling() const { return pooling_; }

private:
    std::shared_ptr<Model> model_;
    ContextPtr ctx_;
    int32_t n_ctx_ = 0;
    std::string pooling_;
};

}  // namespace pydflash
