#include "context_pair.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "backend.h"
#include "batch.h"
#include "errors.h"
#include "llama-ext.h"

namespace pydflash {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// a block holds the anchor plus at most block_size - 1 drafted tokens; asking
// for more is a caller error (llama.cpp clamps silently, which hides typos)
void check_draft_max(int32_t draft_max, const DraftSpec& spec) {
    if (draft_max > spec.max_draft()) {
        throw InvalidArgument("draft_max=" + std::to_string(draft_max) + " exceeds this drafter's block size " +
                              std::to_string(spec.block_size) + " minus 1 = " + std::to_string(spec.max_draft()));
    }
}

}  // namespace

ContextPair::ContextPair(std::shared_ptr<Model> target, std::shared_ptr<Model> drafter, const PairParams& params)
    : target_(std::move(target)), drafter_(std::move(drafter)), params_(params) {
    if (!target_) throw InvalidArgument("a target model is required");
    params_.validate();  // refuse bad options before any work
    params_.n_batch = std::min(params_.n_batch, params_.n_ctx);
    params_.n_ubatch = std::min(params_.n_ubatch, params_.n_batch);

    if (drafter_) {
        spec_ = check_drafter(*target_, *drafter_);
        // a verification batch is block_size tokens; a drafter decode must fit one ubatch
        const int32_t need = spec_.block_size;
        params_.n_batch = std::max(params_.n_batch, need);
        params_.n_ubatch = std::max(params_.n_ubatch, need);
        check_draft_max(params_.draft_max, spec_);
        draft_max_ = params_.draft_max < 0 ? spec_.max_draft() : params_.draft_max;
    } else {
        draft_max_ = 0;
    }

    ensure_backend();
    create_target_context();
    if (drafter_) {
        // features of these target layers are read after every target decode;
        // must be on before the first decode (it forces a scheduler reserve)
        for (int32_t lid : spec_.target_layer_ids) {
            llama_set_embeddings_layer_inp(ctx_tgt_.get(), static_cast<uint32_t>(lid), true);
        }
        llama_context_params dp = context_params(params_, true);
        dp.ctx_other = ctx_tgt_.get();  // the drafter borrows the target's embeddings and head
        ctx_dft_.reset(llama_init_from_model(drafter_->get(), dp));
        if (!ctx_dft_) {
            throw ModelLoadError(drafter_->path() + ": failed to create the drafter context: " + take_thread_errors());
        }
        llama_set_causal_attn(ctx_dft_.get(), spec_.causal);
        batch_dft_.reset(llama_batch_ext_init(ctx_dft_.get()));
        if (!batch_dft_) throw Error("llama_batch_ext_init failed for the drafter");
    }
    llama_set_abort_callback(ctx_tgt_.get(), &ContextPair::abort_callback, this);
    if (ctx_dft_) llama_set_abort_callback(ctx_dft_.get(), &ContextPair::abort_callback, this);
    batch_tgt_.reset(llama_batch_ext_init(ctx_tgt_.get()));
    if (!batch_tgt_) throw Error("llama_batch_ext_init failed for the target");
    sampler_ = std::make_unique<Sampler>(SamplingParams{}, target_->n_vocab());
}

ContextPair::~ContextPair() = default;

void ContextPair::create_target_context() {
    const std::string& want = params_.rollback;
    const std::string arch = "target architecture '" + target_->architecture() + "'";
    const bool recurrent = has_recurrent_state(*target_);
    if (!recurrent && want != "auto" && want != "kv-trim") {
        throw InvalidArgument(arch + " has no recurrent state: its rollback is 'kv-trim', not '" + want + "'");
    }
    if (recurrent && want == "kv-trim") {
        throw DraftCompatibilityError(arch +
                                      " keeps a recurrent state, which trimming the KV cache cannot roll "
                                      "back; use rollback 'auto'");
    }
    if (want == "recurrent-planes" && !drafter_) {
        throw InvalidArgument("rollback 'recurrent-planes' is sized by a drafter's block; this pair has none");
    }
    // State planes for every draft length up to the block (draft_max may change
    // between calls); llama.cpp clamps the request to 0 where the architecture
    // has no partial rollback.
    const bool planes = recurrent && drafter_ && (want == "auto" || want == "recurrent-planes");
    llama_context_params cp = context_params(params_, false);
    cp.n_rs_seq = planes ? static_cast<uint32_t>(spec_.max_draft()) : 0;
    take_thread_errors();
    ctx_tgt_.reset(llama_init_from_model(target_->get(), cp));
    if (!ctx_tgt_) {
        throw ModelLoadError(target_->path() + ": failed to create the target context: " + take_thread_errors());
    }
    n_rs_seq_ = llama_n_rs_seq(ctx_tgt_.get());
    if (!recurrent) {
        rollback_ = RollbackKind::KvTrim;
    } else if (planes && n_rs_seq_ >= cp.n_rs_seq) {
        rollback_ = RollbackKind::RecurrentPlanes;
    } else if (want == "recurrent-planes") {
        ctx_tgt_.reset();
        throw DraftCompatibilityError(arch + " has no partial recurrent-state rollback in llama.cpp (n_rs_seq " +
                                      std::to_string(cp.n_rs_seq) + " was clamped to " + std::to_string(n_rs_seq_) +
                                      "); use rollback 'auto' or 'checkpoint'");
    } else {
        // save the recurrent state before each verification, restore + replay
        n_rs_seq_ = 0;
        rollback_ = RollbackKind::Checkpoint;
        if (llama_get_memory(ctx_tgt_.get()) == nullptr ||
            llama_state_seq_get_size_ext(ctx_tgt_.get(), 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) == 0) {
            ctx_tgt_.reset();
            throw DraftCompatibilityError(arch +
                                          " keeps a recurrent state that llama.cpp can neither roll back "
                                          "partially nor save and restore; rejected draft tokens cannot be removed");
        }
    }
}

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
    n_cached_ = 0;
}

void ContextPair::reset() {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    clear_memory();
}

std::vector<MemoryRow> ContextPair::memory() const {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    std::vector<MemoryRow> rows;
    auto add = [&rows](const char* role, const llama_context* ctx) {
        for (const auto& [buft, m] : llama_get_memory_breakdown(ctx)) {
            rows.push_back({role, buft ? ggml_backend_buft_name(buft) : "?", m.model, m.context, m.compute});
        }
    };
    add("target", ctx_tgt_.get());
    if (ctx_dft_) add("drafter", ctx_dft_.get());
    return rows;
}

void ContextPair::set_sampling(const SamplingParams& params) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    sampler_ = std::make_unique<Sampler>(params, target_->n_vocab());
}

void ContextPair::set_grammar(const GrammarSpec& spec) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    grammar_.reset();
    draft_grammar_.reset();
    grammar_start_.reset();
    if (!spec.gbnf.empty()) {
        // a grammar seen lately (an app's schema, request after request): its
        // allowed-token cache carries over; the most recent few are kept
        auto seen = std::find_if(grammar_caches_.begin(), grammar_caches_.end(),
                                 [&](const auto& c) { return c.first == spec.gbnf; });
        std::shared_ptr<MaskCache> cache;
        if (seen != grammar_caches_.end()) {
            cache = seen->second;
            grammar_caches_.erase(seen);
        }
        grammar_ = std::make_unique<Grammar>(llama_model_get_vocab(target_->get()), spec, cache);
        grammar_start_ = grammar_->clone();
        grammar_caches_.emplace_back(spec.gbnf, grammar_->cache());
        if (grammar_caches_.size() > kGrammarCaches) grammar_caches_.erase(grammar_caches_.begin());
    }
}

std::vector<llama_token> ContextPair::tokens() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<llama_token> out = history_;
    if (pending_) out.push_back(*pending_);
    return out;
}

bool ContextPair::abort_callback(void* data) {
    auto* self = static_cast<ContextPair*>(data);
    if (self->interrupt_.load(std::memory_order_relaxed)) return true;
    if (!self->interrupt_check_) return false;
    // called between graph nodes: poll the (GIL-taking) check only every 20 ms
    const auto now = Clock::now();
    if (now - self->last_check_ < std::chrono::milliseconds(20)) return false;
    self->last_check_ = now;
    if (self->interrupt_check_()) {
        self->interrupt_.store(true);
        return true;
    }
    return false;
}

void ContextPair::fail_rollback(const std::string& what) {
    clear_memory();
    std::string msg = what;
    const std::string logged = take_thread_errors();
    if (!logged.empty()) msg += ": " + logged;
    throw RollbackError(msg + "; the context was reset, call prefill() again");
}

void ContextPair::roll_back_target(const std::vector<llama_token>& batch, int32_t n_keep, bool checkpointed) {
    const auto n_batch = static_cast<int32_t>(batch.size());
    if (n_keep >= n_batch) return;  // everything accepted: nothing to remove
    llama_memory_t mem = llama_get_memory(ctx_tgt_.get());
    if (!checkpointed) {
        // KV trim; with state planes llama.cpp also selects the plane n_batch - n_keep
        // tokens back, and refuses (false) when that is beyond n_rs_seq
        if (fault_.fire(FaultSite::MemoryRemove) || !llama_memory_seq_rm(mem, 0, n_past_ + n_keep, -1)) {
            fail_rollback("llama.cpp refused to remove " + std::to_string(n_batch - n_keep) +
                          " rejected tokens from the target's memory (" + rollback_name(rollback_) + ", n_rs_seq " +
                          std::to_string(n_rs_seq_) + ")");
        }
        return;
    }
    try {
        checkpoint_.restore(ctx_tgt_.get());
    } catch (const RollbackError& e) {
        fail_rollback(e.what());
    }
    // the state is back before the verified batch; drop its K/V, then replay
    // the kept tokens (their features come from this pass too)
    if (fault_.fire(FaultSite::MemoryRemove) || !llama_memory_seq_rm(mem, 0, n_past_, -1)) {
        fail_rollback("llama.cpp refused to remove the verified tokens after restoring the checkpoint");
    }
    decode_target(batch.data(), n_keep, n_past_, false);
}

void ContextPair::fail_decode(const std::string& what, int32_t rc) {
    // a failed decode leaves the caches in an unknown state: start clean
    clear_memory();
    if (interrupt_.exchange(false)) {
        take_thread_errors();
        throw Interrupted(what + " was interrupted; the context was reset");
    }
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
    const int32_t rc =
        fault_.fire(FaultSite::TargetDecode) ? -1 : llama_process(ctx_tgt_.get(), LLAMA_PROCESS_TYPE_DECODE, b);
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
                std::memcpy(dst + k * n_embd, layers[k] + static_cast<size_t>(off + i) * n_embd,
                            n_embd * sizeof(float));
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
        const int32_t rc =
            fault_.fire(FaultSite::DrafterDecode) ? -1 : llama_process(ctx_dft_.get(), LLAMA_PROCESS_TYPE_DECODE, b);
        if (rc != 0) fail_decode("drafter feature injection", rc);
    }
}

int32_t ContextPair::keep_common_prefix(const std::vector<llama_token>& tokens, int32_t n) {
    // the longest prefix of the cached history that the new prompt repeats
    int32_t common = 0;
    const auto n_hist = static_cast<int32_t>(history_.size());
    while (common < n && common < n_hist &&
           history_[static_cast<size_t>(common)] == tokens[static_cast<size_t>(common)]) {
        ++common;
    }
    // a recurrent state cannot be cut back to an arbitrary position: it is kept
    // only when the whole history is a prefix (a conversation's next turn)
    const bool recurrent = rollback_ != RollbackKind::KvTrim;
    if (common == 0 || (recurrent && common < n_hist)) return 0;
    if (common < n_hist) {
        // K/V and the drafter's injected features are per position: drop the rest
        if (!llama_memory_seq_rm(llama_get_memory(ctx_tgt_.get()), 0, common, -1)) return 0;
        if (ctx_dft_ && !llama_memory_seq_rm(llama_get_memory(ctx_dft_.get()), 0, common, -1)) return 0;
    }
    history_.resize(static_cast<size_t>(common));
    n_past_ = common;
    return common;
}

double ContextPair::prefill(const std::vector<llama_token>& tokens, bool reuse) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    if (tokens.empty()) throw InvalidArgument("prefill needs at least one token");
    for (llama_token t : tokens) target_->check_token(t);
    if (tokens.size() > static_cast<size_t>(params_.n_ctx) - 1) {
        throw ContextLimitError("prompt has " + std::to_string(tokens.size()) + " tokens but the context holds " +
                                std::to_string(params_.n_ctx) + " (at most " + std::to_string(params_.n_ctx - 1) +
                                " prompt tokens leave room to generate)");
    }
    // a new generation: the grammar starts over
    if (grammar_) grammar_->assign_state(*grammar_start_);
    const auto t0 = Clock::now();
    last_check_ = t0;
    const auto n = static_cast<int32_t>(tokens.size()) - 1;  // the last token stays pending
    n_cached_ = reuse ? keep_common_prefix(tokens, n) : 0;
    if (n_cached_ == 0) clear_memory();
    pending_.reset();
    const int32_t chunk = params_.n_batch;
    for (int32_t off = n_cached_; off < n; off += chunk) {
        const int32_t m = std::min(chunk, n - off);
        decode_target(tokens.data() + off, m, off, false);
        if (drafter_) inject(m, off);
    }
    history_.assign(tokens.begin(), tokens.end() - 1);
    pending_ = tokens.back();
    n_past_ = n;
    return ms_since(t0);
}

std::vector<float> ContextPair::score(const std::vector<llama_token>& tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    if (tokens.empty()) throw InvalidArgument("score needs at least one token");
    for (llama_token t : tokens) target_->check_token(t);
    if (tokens.size() > static_cast<size_t>(params_.n_ctx)) {
        throw ContextLimitError("score: " + std::to_string(tokens.size()) + " tokens do not fit in n_ctx " +
                                std::to_string(params_.n_ctx));
    }
    clear_memory();
    const auto n = static_cast<int32_t>(tokens.size());
    const auto n_vocab = static_cast<size_t>(target_->n_vocab());
    std::vector<float> out(static_cast<size_t>(n) * n_vocab);
    const int32_t chunk = params_.n_batch;
    for (int32_t off = 0; off < n; off += chunk) {
        const int32_t m = std::min(chunk, n - off);
        decode_target(tokens.data() + off, m, off, true);
        for (int32_t i = 0; i < m; ++i) {
            const float* row = llama_get_logits_ith(ctx_tgt_.get(), i);
            if (row == nullptr) fail_decode("reading target logits", -1);
            std::memcpy(out.data() + static_cast<size_t>(off + i) * n_vocab, row, n_vocab * sizeof(float));
        }
    }
    clear_memory();
    return out;
}

void ContextPair::check(const DraftControl& control) const {
    control.validate();
    if (drafter_) check_draft_max(control.draft_max, spec_);
}

std::vector<llama_token> ContextPair::choose_draft(const DraftControl& control,
                                                   const std::optional<std::vector<llama_token>>& external,
                                                   int32_t room, std::vector<Distribution>& q, StepResult& r) {
    if (external) {
        for (llama_token t : *external) target_->check_token(t);
        if (external->size() + 1 > static_cast<size_t>(params_.n_batch)) {
            throw InvalidArgument("external draft of " + std::to_string(external->size()) +
                                  " tokens exceeds n_batch - 1 = " + std::to_string(params_.n_batch - 1));
        }
        const auto n = std::min<size_t>(external->size(), static_cast<size_t>(room));
        return {external->begin(), external->begin() + static_cast<std::ptrdiff_t>(n)};
    }
    int32_t k = control.draft_max < 0 ? draft_max_ : control.draft_max;
    k = std::min({k, max_draft(), room});
    if (!drafter_ || k <= 0 || k < control.draft_min) return {};
    const auto t0 = Clock::now();
    std::vector<llama_token> draft = draft_block(k, control, q);
    r.t_draft_ms = ms_since(t0);
    return draft;
}

StepResult ContextPair::step(const DraftControl& control, const std::optional<std::vector<llama_token>>& external) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    if (!pending_) throw InvalidArgument("nothing to continue from: call prefill() first");
    if (external) {
        control.validate();  // an external draft is not bounded by the block
    } else {
        check(control);
    }
    const int32_t room = params_.n_ctx - n_past_ - 1;
    if (room < 0) {
        throw ContextLimitError("the context is full (" + std::to_string(params_.n_ctx) + " tokens)");
    }
    StepResult r;
    std::vector<Distribution> q;
    std::vector<llama_token> draft = choose_draft(control, external, room, q, r);
    const auto k = static_cast<int32_t>(draft.size());

    // a recurrent state rolls back at most n_rs_seq tokens through its planes;
    // a longer draft (or no planes at all) needs a checkpoint
    const bool checkpointed = rollback_ != RollbackKind::KvTrim && k > static_cast<int32_t>(n_rs_seq_);
    auto t0 = Clock::now();
    if (checkpointed) {
        try {
            checkpoint_.save(ctx_tgt_.get());
        } catch (const RollbackError& e) {
            fail_rollback(e.what());
        }
    }
    r.t_rollback_ms = ms_since(t0);

    // verify [pending, d1..dk] in one target pass, every row with logits
    std::vector<llama_token> batch;
    batch.reserve(static_cast<size_t>(k) + 1);
    batch.push_back(*pending_);
    batch.insert(batch.end(), draft.begin(), draft.end());
    t0 = Clock::now();
    decode_target(batch.data(), k + 1, n_past_, true);
    r.t_verify_ms = ms_since(t0);

    t0 = Clock::now();
    int32_t n_acc = 0;
    try {
        r.tokens = accept(draft, q, external.has_value(), n_acc, r.logprobs);
    } catch (const GrammarError& e) {
        // the verified rows are in the caches but not committed: start clean
        clear_memory();
        throw GrammarError(std::string(e.what()) + "; the context was reset");
    }
    r.t_sample_ms = ms_since(t0);

    // roll back the rejected tail, then inject the kept rows of the last target
    // pass (the verification, or the replay after a restored checkpoint);
    // features are per position, so this equals injecting all rows and trimming
    const int32_t n_keep = 1 + n_acc;
    t0 = Clock::now();
    roll_back_target(batch, n_keep, checkpointed);
    r.t_rollback_ms += ms_since(t0);
    if (drafter_) {
        t0 = Clock::now();
        inject(n_keep, n_past_);
        r.t_inject_ms = ms_since(t0);
    }
    const int32_t new_past = n_past_ + n_keep;
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
