// The target's layer inputs ("features", what a DFlash drafter reads) for whole
// sequences, for training a drafter: a context of the target's own with
// llama.cpp's layer-input capture on, so the pair's caches are never touched.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "handles.h"
#include "model.h"

namespace pydflash {

struct CapturedSequence {
    std::vector<float> features;    // (n_tokens, n_layers * n_embd), row-major, layer after layer
    std::vector<llama_token> top;   // (n_tokens, top_k): the target's likeliest next tokens, best first
    std::vector<float> top_logits;  // (n_tokens, top_k): their logits
};

class FeatureCapture {
public:
    // `layer_ids`: llama.cpp's ids (the input of layer id = the output of layer id - 1,
    // upstream's dflash.target_layers); `n_ctx`: the longest sequence.
    FeatureCapture(std::shared_ptr<Model> model, std::vector<int32_t> layer_ids, int32_t n_ctx, int32_t n_batch,
                   int32_t n_threads);

    // One sequence from position 0, in passes of n_batch tokens; with top_k > 0, also the
    // target's top_k next tokens and logits at each position (top_k 1: its greedy token).
    CapturedSequence capture(const std::vector<llama_token>& tokens, int32_t top_k);

    int32_t n_ctx() const { return n_ctx_; }
    int32_t width() const { return static_cast<int32_t>(layer_ids_.size()) * model_->n_embd(); }
    const std::vector<int32_t>& layer_ids() const { return layer_ids_; }

private:
    std::shared_ptr<Model> model_;
    std::vector<int32_t> layer_ids_;
    ContextPtr ctx_;
    BatchPtr batch_;
    int32_t n_ctx_ = 0;
    int32_t n_batch_ = 0;
};

}  // namespace pydflash
