#include "feature_capture.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <utility>

#include "backend.h"
#include "batch.h"
#include "drafter.h"
#include "errors.h"
#include "llama-ext.h"

namespace pydflash {

FeatureCapture::FeatureCapture(std::shared_ptr<Model> model, std::vector<int32_t> layer_ids, int32_t n_ctx,
                               int32_t n_batch, int32_t n_threads)
    : model_(std::move(model)), layer_ids_(std::move(layer_ids)), n_ctx_(n_ctx), n_batch_(n_batch) {
    if (!target_exposes_layer_inputs(model_->architecture())) {
        throw DraftCompatibilityError(model_->path() + ": target architecture '" + model_->architecture() +
                                      "' does not expose layer inputs in llama.cpp, so no drafter can read its "
                                      "features");
    }
    if (model_->is_recurrent() || model_->is_hybrid()) {
        // one fresh sequence per capture is all this needs, but a recurrent state is not
        // a per-position cache: refuse rather than capture what a drafter never sees
        throw DraftCompatibilityError(model_->path() +
                                      ": feature capture for recurrent or hybrid targets is "
                                      "not supported");
    }
    if (layer_ids_.empty()) throw InvalidArgument("feature capture needs at least one target layer id");
    for (int32_t id : layer_ids_) {
        if (id < 0 || id >= model_->n_layer()) {
            throw InvalidArgument("target layer id " + std::to_string(id) + " is out of range: the target has " +
                                  std::to_string(model_->n_layer()) + " layers (valid ids 0.." +
                                  std::to_string(model_->n_layer() - 1) + ")");
        }
    }
    if (n_ctx < 1) throw InvalidArgument("the capture context must hold at least 1 token");
    if (n_batch < 1) throw InvalidArgument("n_batch must be at least 1");
    n_batch_ = std::min(n_batch, n_ctx);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<uint32_t>(n_ctx);
    cp.n_batch = static_cast<uint32_t>(n_batch_);
    cp.n_ubatch = static_cast<uint32_t>(n_batch_);
    cp.n_seq_max = 1;
    if (n_threads <= 0) n_threads = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.no_perf = true;
    take_thread_errors();
    ctx_.reset(llama_init_from_model(model_->get(), cp));
    if (!ctx_) {
        throw ModelLoadError(model_->path() + ": failed to create the capture context: " + take_thread_errors());
    }
    batch_.reset(llama_batch_ext_init(ctx_.get()));
    if (!batch_) throw Error("llama_batch_ext_init failed for the capture context");
    // before the first decode: it reserves the graph with the capture outputs
    for (int32_t id : layer_ids_) llama_set_embeddings_layer_inp(ctx_.get(), static_cast<uint32_t>(id), true);
}

CapturedSequence FeatureCapture::capture(const std::vector<llama_token>& tokens, int32_t top_k) {
    if (tokens.empty()) throw InvalidArgument("nothing to capture: the token list is empty");
    if (top_k < 0 || top_k > model_->n_vocab()) {
        throw InvalidArgument("top_k must be in [0, " + std::to_string(model_->n_vocab()) + "], got " +
                              std::to_string(top_k));
    }
    const bool with_logits = top_k > 0;
    if (static_cast<int64_t>(tokens.size()) > n_ctx_) {
        throw ContextLimitError("a sequence of " + std::to_string(tokens.size()) +
                                " tokens does not fit the capture context of " + std::to_string(n_ctx_) + " tokens");
    }
    for (llama_token t : tokens) model_->check_token(t);
    llama_memory_clear(llama_get_memory(ctx_.get()), true);
    const auto n_embd = static_cast<size_t>(model_->n_embd());
    const size_t width = layer_ids_.size() * n_embd;
    const int32_t n_vocab = model_->n_vocab();
    CapturedSequence out;
    out.features.resize(tokens.size() * width);
    out.top.resize(tokens.size() * static_cast<size_t>(top_k));
    out.top_logits.resize(out.top.size());
    std::vector<int32_t> order(static_cast<size_t>(n_vocab));
    llama_batch_ext* b = batch_.get();
    for (size_t start = 0; start < tokens.size(); start += static_cast<size_t>(n_batch_)) {
        const auto n = static_cast<int32_t>(std::min(tokens.size() - start, static_cast<size_t>(n_batch_)));
        llama_batch_ext_clear(b);
        for (int32_t i = 0; i < n; ++i) {
            add_token(b, 0, tokens[start + static_cast<size_t>(i)], static_cast<llama_pos>(start) + i, with_logits);
        }
        take_thread_errors();
        const int32_t rc = llama_process(ctx_.get(), LLAMA_PROCESS_TYPE_DECODE, b);
        if (rc != 0) {
            llama_memory_clear(llama_get_memory(ctx_.get()), true);
            throw DecodeError("feature capture pass failed (llama_process returned " + std::to_string(rc) + ")");
        }
        for (size_t k = 0; k < layer_ids_.size(); ++k) {
            const float* rows = llama_get_embeddings_layer_inp(ctx_.get(), static_cast<uint32_t>(layer_ids_[k]));
            if (rows == nullptr)
                throw DecodeError("llama.cpp returned no layer inputs for layer " + std::to_string(layer_ids_[k]));
            for (int32_t i = 0; i < n; ++i) {
                float* dst = out.features.data() + (start + static_cast<size_t>(i)) * width + k * n_embd;
                std::memcpy(dst, rows + static_cast<size_t>(i) * n_embd, n_embd * sizeof(float));
            }
        }
        if (!with_logits) continue;
        for (int32_t i = 0; i < n; ++i) {
            const float* logits = llama_get_logits_ith(ctx_.get(), i);
            if (logits == nullptr) throw DecodeError("llama.cpp returned no logits for row " + std::to_string(i));
            const size_t row = (start + static_cast<size_t>(i)) * static_cast<size_t>(top_k);
            std::iota(order.begin(), order.end(), 0);
            // the best first; equal logits by token id, so the first is the argmax sampling picks
            std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t x, int32_t y) {
                return logits[x] > logits[y] || (logits[x] == logits[y] && x < y);
            });
            for (int32_t k = 0; k < top_k; ++k) {
                out.top[row + static_cast<size_t>(k)] = order[static_cast<size_t>(k)];
                out.top_logits[row + static_cast<size_t>(k)] = logits[order[static_cast<size_t>(k)]];
            }
        }
    }
    return out;
}

}  // namespace pydflash
