#include "context_pair.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "backend.h"
#include "errors.h"
#include "llama-ext.h"

namespace pydflash {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

llama_context_params context_params(const PairParams& p) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = p.n_ctx;
    cp.n_batch = p.n_batch;
    cp.n_ubatch = p.n_ubatch;
    cp.n_seq_max = 1;
    cp.n_rs_seq = 0;
    int32_t threads = p.n_threads;
    if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.no_perf = true;
    return cp;
}

void add_token(llama_batch_ext* b, llama_token id, llama_pos pos, bool output) {
    const int32_t idx = llama_batch_ext_add_token(b, 0, id);
    if (idx < 0) throw Error("batch is full (llama_batch_ext_add_token returned " + std::to_string(idx) + ")");
    const llama_pos p4[4] = {pos, pos, pos, 0};
    if (!llama_batch_ext_set_pos(b, idx, p4)) throw Error("llama_batch_ext_set_pos failed");
    if (output && !llama_batch_ext_set_output_logits(b, idx, true)) {
        throw Error("llama_batch_ext_set_output_logits failed");
    }
}

}  // namespace

ContextPair::ContextPair(std::shared_ptr<Model> target, std::shared_ptr<Model> drafter,
                         const PairParams& params)
    : target_(std::move(target)), drafter_(std::move(drafter)), params_(params) {
    if (!target_) throw InvalidArgument("a target model is required");
    if (params_.n_ctx < 8) throw InvalidArgument("n_ctx must be >= 8, got " + std::to_string(params_.n_ctx));
    if (params_.n_ubatch == 0 || params_.n_batch == 0) throw InvalidArgument("n_batch and n_ubatch must be > 0");
    params_.n_batch = std::min(params_.n_batch, params_.n_ctx);
    params_.n_ubatch = std::min(params_.n_ubatch, params_.n_batch);

    if (drafter_) {
        spec_ = check_drafter(*target_, *drafter_);
        // a verification batch is block_size tokens; a drafter decode must fit one ubatch
        const auto need = static_cast<uint32_t>(spec_.block_size);
        params_.n_batch = std::max(params_.n_batch, need);
        params_.n_ubatch = std::max(params_.n_ubatch, need);
        draft_max_ = params_.draft_max < 0 ? spec_.max_draft() : std::min(params_.draft_max, spec_.max_draft());
    } else {
        draft_max_ = 0;
    }

    ensure_backend();
    take_thread_errors();
    llama_context_params cp = context_params(params_);
    ctx_tgt_.reset(llama_init_from_model(target_->get(), cp));
    if (!ctx_tgt_) {
        throw ModelLoadError(target_->path() + ": failed to create the target context: " + take_thread_errors());
    }
    if (drafter_) {
        // features of these target layers are read after every target decode;
        // must be on before the first decode (it forces a scheduler reserve)
        for (int32_t lid : spec_.target_layer_ids) {
            llama_set_embeddings_layer_inp(ctx_tgt_.get(), static_cast<uint32_t>(lid), true);
        }
        llama_context_params dp = context_params(params_);
        dp.ctx_other = ctx_tgt_.get();  // the drafter borrows the target's embeddings and head
        ctx_dft_.reset(llama_init_from_model(drafter_->get(), dp));
        if (!ctx_dft_) {
            throw ModelLoadError(drafter_->path() + ": failed to create the drafter context: " +
                                 take_thread_errors());
        }
        llama_set_causal_attn(ctx_dft_.get(), spec_.causal);
        batch_dft_.reset(llama_batch_ext_init(ctx_dft_.get()));
        if (!batch_dft_) throw Error("llama_batch_ext_init failed for the drafter");
    }
    batch_tgt_.reset(llama_batch_ext_init(ctx_tgt_.get()));
    if (!batch_tgt_) throw Error("llama_batch_ext_init failed for the target");
    sampler_ = std::make_unique<Sampler>(SamplingParams{}, target_->n_vocab());
}

ContextPair::~ContextPair() = default;

void ContextPair::require_open() const {
    if (!ctx_tgt_) throw Error("this context pair is closed");
}

void ContextPair::close() {
    std::lock_guard<std::mutex> lock(mu_);
    // the drafter context references the target's: free it first
    batch_dft_.reset();
    batch_tgt_.reset();
    ctx_dft_.reset();
    ctx_tgt_.reset();
    drafter_.reset();
    target_.reset();
    pending_.reset();
    history_.clear();
    n_past_ = 0;
}

void ContextPair::clear_memory() {
    if (ctx_tgt_) llama_memory_clear(llama_get_memory(ctx_tgt_.get()), true);
    if (ctx_dft_) llama_memory_clear(llama_get_memory(ctx_dft_.get()), true);
    pending_.reset();
    history_.clear();
    n_past_ = 0;
}

void ContextPair::reset() {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    clear_memory();
}

void ContextPair::set_sampling(const SamplingParams& params) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    sampler_ = std::make_unique<Sampler>(params, target_->n_vocab());
}

std::vector<llama_token> ContextPair::tokens() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<llama_token> out = history_;
    if (pending_) out.push_back(*pending_);
    return out;
}

void ContextPair::fail_decode(const std::string& what, int32_t rc) {
    // a failed decode leaves the caches in an unknown state: start clean
    clear_memory();
    std::string msg = what + " failed (llama.cpp returned " + std::to_string(rc) + ")";
    const std::string logged = take_thread_errors();
    if (!logged.empty()) msg += ": " + logged;
    msg += "; the context was reset, call prefill() again";
    throw DecodeError(msg);
}

void ContextPair::decode_target(const llama_token* tokens, int32_t n, llama_pos pos0, bool all_logits) {
    llama_batch_ext* b = batch_tgt_.get();
    llama_batch_ext_clear(b);
    for (int32_t i = 0; i < n; ++i) add_token(b, tokens[i], pos0 + i, all_logits);
    const int32_t rc = llama_process(ctx_tgt_.get(), LLAMA_PROCESS_TYPE_DECODE, b);
    if (rc != 0) fail_decode("target decode", rc);
}

void ContextPair::inject(int32_t n_rows, llama_pos pos0) {
    // rows 0..n_rows-1 of the last target decode, at positions pos0..
    const auto n_ids = spec_.target_layer_ids.size();
    const size_t n_embd = static_cast<size_t>(spec_.n_embd_target);
    const size_t n_enc = n_ids * n_embd;
    const auto chunk_max = static_cast<int32_t>(llama_n_ubatch(ctx_dft_.get()));
    std::vector<const float*> layers(n_ids);
    for (size_t k = 0; k < n_ids; ++k) {
        layers[k] = llama_get_embeddings_layer_inp(ctx_tgt_.get(), static_cast<uint32_t>(spec_.target_layer_ids[k]));
        if (layers[k] == nullptr) fail_decode("reading target layer features", -1);
    }
    for (int32_t off = 0; off < n_rows; off += chunk_max) {
        const int32_t n_chunk = std::min(chunk_max, n_rows - off);
        features_.resize(static_cast<size_t>(n_chunk) * n_enc);
        for (int32_t i = 0; i < n_chunk; ++i) {
            float* dst = features_.data() + static_cast<size_t>(i) * n_enc;
            for (size_t k = 0; k < n_ids; ++k) {
                std::memcpy(dst + k * n_embd, layers[k] + static_cast<size_t>(off + i) * n_embd, n_embd * sizeof(float));
            }
        }
        llama_batch_ext* b = batch_dft_.get();
        llama_batch_ext_clear(b);
        for (int32_t i = 0; i < n_chunk; ++i) {
            const llama_embd e{features_.data() + static_cast<size_t>(i) * n_enc, 1, n_enc};
            const int32_t idx = llama_batch_ext_add_embd(b, 0, e);
            if (idx < 0) fail_decode("building the feature batch", idx);
            const llama_pos p = pos0 + off + i;
            const llama_pos p4[4] = {p, p, p, 0};  // M-RoPE drafters read 4 positions per embedding
            if (!llama_batch_ext_set_pos(b, idx, p4)) fail_decode("setting feature positions", -1);
        }
        const int32_t rc = llama_process(ctx_dft_.get(), LLAMA_PROCESS_TYPE_DECODE, b);
        if (rc != 0) fail_decode("drafter feature injection", rc);
    }
}

std::vector<llama_token> ContextPair::draft_block(int32_t n) {
    llama_batch_ext* b = batch_dft_.get();
    llama_batch_ext_clear(b);
    add_token(b, *pending_, n_past_, false);
    for (int32_t i = 1; i <= n; ++i) add_token(b, spec_.mask_token, n_past_ + i, true);
    const int32_t rc = llama_process(ctx_dft_.get(), LLAMA_PROCESS_TYPE_DECODE, b);
    if (rc != 0) fail_decode("drafter block decode", rc);
    std::vector<llama_token> out;
    out.reserve(static_cast<size_t>(n));
    const int32_t n_vocab = target_->n_vocab();
    for (int32_t i = 1; i <= n; ++i) {
        const float* logits = llama_get_logits_ith(ctx_dft_.get(), i);
        if (logits == nullptr) fail_decode("reading drafter logits", -1);
        out.push_back(argmax(logits, n_vocab));
    }
    // the block's K/V are noise: the drafter cache must hold only injected features
    llama_memory_seq_rm(llama_get_memory(ctx_dft_.get()), 0, n_past_, -1);
    return out;
}

double ContextPair::prefill(const std::vector<llama_token>& tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    if (tokens.empty()) throw InvalidArgument("prefill needs at least one token");
    for (llama_token t : tokens) target_->check_token(t);
    if (tokens.size() > params_.n_ctx - 1) {
        throw ContextLimitError("prompt has " + std::to_string(tokens.size()) +
                                " tokens but the context holds " + std::to_string(params_.n_ctx) +
                                " (at most " + std::to_string(params_.n_ctx - 1) +
                                " prompt tokens leave room to generate)");
    }
    const auto t0 = Clock::now();
    clear_memory();
    const auto n = static_cast<int32_t>(tokens.size()) - 1;
    const auto chunk = static_cast<int32_t>(params_.n_batch);
    for (int32_t off = 0; off < n; off += chunk) {
        const int32_t m = std::min(chunk, n - off);
        decode_target(tokens.data() + off, m, off, false);
        if (drafter_) inject(m, off);
    }
    history_.assign(tokens.begin(), tokens.end() - 1);
    pending_ = tokens.back();
    n_past_ = n;
    return ms_since(t0);
}

StepResult ContextPair::step(int32_t draft_max, const std::optional<std::vector<llama_token>>& external) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    if (!pending_) throw InvalidArgument("nothing to continue from: call prefill() first");
    const int32_t room = static_cast<int32_t>(params_.n_ctx) - n_past_ - 1;
    if (room < 0) {
        throw ContextLimitError("the context is full (" + std::to_string(params_.n_ctx) + " tokens)");
    }
    StepResult r;
    std::vector<llama_token> draft;
    if (external) {
        for (llama_token t : *external) target_->check_token(t);
        if (external->size() + 1 > params_.n_batch) {
            throw InvalidArgument("external draft of " + std::to_string(external->size()) +
                                  " tokens exceeds n_batch - 1 = " + std::to_string(params_.n_batch - 1));
        }
        draft.assign(external->begin(), external->begin() + std::min<size_t>(external->size(), static_cast<size_t>(room)));
    } else {
        int32_t k = draft_max < 0 ? draft_max_ : draft_max;
        k = std::min({k, max_draft(), room});
        if (drafter_ && k > 0) {
            const auto t0 = Clock::now();
            draft = draft_block(k);
            r.t_draft_ms = ms_since(t0);
        }
    }
    const auto k = static_cast<int32_t>(draft.size());

    // verify [pending, d1..dk] in one target pass, every row with logits
    std::vector<llama_token> batch;
    batch.reserve(static_cast<size_t>(k) + 1);
    batch.push_back(*pending_);
    batch.insert(batch.end(), draft.begin(), draft.end());
    auto t0 = Clock::now();
    decode_target(batch.data(), k + 1, n_past_, true);
    r.t_verify_ms = ms_since(t0);

    // accept while the target's own choice equals the draft
    t0 = Clock::now();
    int32_t n_acc = 0;
    for (int32_t i = 0; i <= k; ++i) {
        const float* logits = llama_get_logits_ith(ctx_tgt_.get(), i);
        if (logits == nullptr) fail_decode("reading target logits", -1);
        const llama_token t = sampler_->sample(logits);
        r.tokens.push_back(t);
        if (i == k || t != draft[static_cast<size_t>(i)]) break;
        ++n_acc;
    }
    r.t_sample_ms = ms_since(t0);

    // roll back the rejected tail; inject only the kept rows (features are
    // per-position, so this equals injecting all rows and trimming)
    const int32_t n_keep = 1 + n_acc;
    if (drafter_) {
        t0 = Clock::now();
        inject(n_keep, n_past_);
        r.t_inject_ms = ms_since(t0);
    }
    const int32_t new_past = n_past_ + n_keep;
    if (!llama_memory_seq_rm(llama_get_memory(ctx_tgt_.get()), 0, new_past, -1)) {
        fail_decode("removing rejected tokens from the target cache", -1);
    }
    if (ctx_dft_) llama_memory_seq_rm(llama_get_memory(ctx_dft_.get()), 0, new_past, -1);
    history_.insert(history_.end(), batch.begin(), batch.begin() + n_keep);
    n_past_ = new_past;
    pending_ = r.tokens.back();

    r.drafted = std::move(draft);
    r.n_drafted = k;
    r.n_accepted = n_acc;
    r.n_past = n_past_;
    return r;
}

}  // namespace pydflash
