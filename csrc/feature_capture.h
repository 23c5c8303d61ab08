// The target's layer inputs ("features", what a DFlash drafter reads) for whole
// sequences, for training a drafter: a context of the target's own with
// llama.cpp's layer-input capture on, so the pair's caches are never touched.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ggml.h"
#include "handles.h"
#include "model.h"

namespace pydflash {

struct CapturedSequence {
    std::vector<float> features;    // (n_tokens, n_layers * n_embd), row-major, layer after layer
    std::vector<llama_token> top;   // (n_tokens, top_k): the target's likeliest next tokens, best first
    std::vector<float> top_logits;  // (n_tokens, top_k): their logits
};

struct GeneratedSequence {
    std::vector<llama_token> reply;     // the greedy reply, without the end-of-generation token that ended it
    std::vector<ggml_fp16_t> features;  // (prompt + reply tokens, n_layers * n_embd), capture()'s rows in F16
};

class FeatureCapture {
public:
    // `layer_ids`: llama.cpp's ids (the input of layer id = the output of layer id - 1,
    // upstream's dflash.target_layers); `n_ctx`: the longest sequence; `n_seq`: the
    // sequences generate() decodes at once.
    FeatureCapture(std::shared_ptr<Model> model, std::vector<int32_t> layer_ids, int32_t n_ctx, int32_t n_batch,
                   int32_t n_threads, int32_t n_seq = 1);

    // One sequence from position 0, in passes of n_batch tokens; with top_k > 0, also the
    // target's top_k next tokens and logits at each position (top_k 1: its greedy token).
    CapturedSequence capture(const std::vector<llama_token>& tokens, int32_t top_k);

    // The target's greedy replies (up to `max_new` tokens, ending at an end-of-generation
    // token) to each prompt, n_seq at a time, with the features of every prompt and reply
    // position recorded by the passes that generate them: one pass over each token where
    // generating the replies and then capturing them would take two.
    std::vector<GeneratedSequence> generate(const std::vector<std::vector<llama_token>>& prompts, int32_t max_new);

    int32_t n_ctx() const { return n_ctx_; }
    int32_t n_seq() const { return n_seq_; }
    int32_t width() const { return static_cast<int32_t>(layer_ids_.size()) * model_->n_embd(); }
    const std::vector<int32_t>& layer_ids() const { return layer_ids_; }

private:
    // InvalidArgument / ContextLimitError unless every prompt and its reply fit a sequence
    void check_prompts(const std::vector<std::vector<llama_token>>& prompts, int32_t max_new) const;

    std::shared_ptr<Model> model_;
    std::vector<int32_t> layer_ids_;
    ContextPtr ctx_;
    BatchPtr batch_;
    int32_t n_ctx_ = 0;
    int32_t n_batch_ = 0;
    int32_t n_seq_ = 1;
};

}  // namespace pydflash
