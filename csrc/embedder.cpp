#include "embedder.h"

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <utility>

#include "backend.h"
#include "errors.h"

namespace pydflash {

namespace {

enum llama_pooling_type parse_pooling(const std::string& name) {
    if (name == "none") return LLAMA_POOLING_TYPE_NONE;
    if (name == "mean") return LLAMA_POOLING_TYPE_MEAN;
    if (name == "cls") return LLAMA_POOLING_TYPE_CLS;
    if (name == "last") return LLAMA_POOLING_TYPE_LAST;
    throw InvalidArgument("pooling must be 'mean', 'cls', 'last', 'none' or '' (the model's), got '" + name + "'");
}

// The GGUF's own pooling type; a generative model names none, and is mean-pooled.
std::string model_pooling(const Model& model) {
    const auto& md = model.info().metadata;
    const auto it = md.find(model.architecture() + ".pooling_type");
    if (it == md.end()) return "mean";
    static const char* const names[] = {"none", "mean", "cls", "last"};
    const int v = std::atoi(it->second.c_str());
    return v >= 1 && v <= 3 ? names[v] : "mean";
}

}  // namespace

Embedder::Embedder(std::shared_ptr<Model> model, int32_t n_ctx, int32_t n_threads, const std::string& pooling)
    : model_(std::move(model)), n_ctx_(n_ctx), pooling_(pooling.empty() ? model_pooling(*model_) : pooling) {
    if (n_ctx < 1) throw InvalidArgument("the embedding context must hold at least 1 token");
    llama_context_params cp = llama_context_default_params();
    cp.embeddings = true;
    cp.pooling_type = parse_pooling(pooling_);
    cp.n_ctx = static_cast<uint32_t>(n_ctx);
    cp.n_batch = static_cast<uint32_t>(n_ctx);
    cp.n_ubatch = static_cast<uint32_t>(n_ctx);
    cp.n_seq_max = 1;
    if (n_threads <= 0) n_threads = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.no_perf = true;
    take_thread_errors();
    ctx_.reset(llama_init_from_model(model_->get(), cp));
    if (!ctx_) {
        throw ModelLoadError(model_->path() + ": failed to create the embedding context: " + take_thread_errors());
    }
}

std::vector<float> Embedder::embed(const std::vector<llama_token>& tokens) {
    if (tokens.empty()) throw InvalidArgument("nothing to embed: the token list is empty");
    if (static_cast<int64_t>(tokens.size()) > n_ctx_) {
        throw ContextLimitError("input of " + std::to_string(tokens.size()) +
                                " tokens does not fit the embedding context of " + std::to_string(n_ctx_) +
                                " tokens (n_batch)");
    }
    for (llama_token t : tokens) model_->check_token(t);
    llama_memory_clear(llama_get_memory(ctx_.get()), true);
    std::vector<llama_token> ids(tokens);
    take_thread_errors();
    const int32_t rc = llama_decode(ctx_.get(), llama_batch_get_one(ids.data(), static_cast<int32_t>(ids.size())));
    if (rc != 0) throw DecodeError("embedding pass failed (llama_decode returned " + std::to_string(rc) + ")");
    const size_t n_embd = static_cast<size_t>(model_->n_embd());
    std::vector<float> out;
    if (pooling_ == "none") {
        out.reserve(ids.size() * n_embd);
        for (size_t i = 0; i < ids.size(); ++i) {
            const float* row = llama_get_embeddings_ith(ctx_.get(), static_cast<int32_t>(i));
            if (row == nullptr) throw DecodeError("llama.cpp returned no embedding for token " + std::to_string(i));
            out.insert(out.end(), row, row + n_embd);
        }
        return out;
    }
    const float* row = llama_get_embeddings_seq(ctx_.get(), 0);
    if (row == nullptr) throw DecodeError("llama.cpp returned no pooled embedding");
    out.assign(row, row + n_embd);
    return out;
}

}  // namespace pydflash
