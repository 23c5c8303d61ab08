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
        const std::string most = spec.anchor_first
                                     ? " (anchor-first: a block drafts " + std::to_string(spec.max_draft())
                                     : " minus 1 = " + std::to_string(spec.max_draft());
        throw InvalidArgument("draft_max=" + std::to_string(draft_max) + " exceeds this drafter's block size " +
                              std::to_string(spec.block_size) + most + (spec.anchor_first ? ")" : ""));
    }
}

}  // namespace

ContextPair::ContextPair(std::shared_ptr<Model> target, std::shared_ptr<Model> drafter, const PairParams& params)
    : target_(std::move(target)), drafter_(std::move(drafter)), params_(params) {
    if (!target_) throw InvalidArgument("a target model is required");
    params_.validate();  // refuse bad options before any work
    params_.n_batch = std::min(params_.n_batch, params_.n_ctx);
    params_.n_ubatch = std::min(params_.n_ubatch, params_.n_batch);

    DFlashDrafter::Window window;
    if (drafter_) {
        spec_ = check_drafter(*target_, *drafter_);
        // a verification batch is 1 + max_draft tokens per sequence; a drafter decode
        // (every sequence's block) must fit one ubatch
        const int32_t need = (1 + spec_.max_draft()) * params_.n_seq;
        params_.n_batch = std::max(params_.n_batch, need);
        params_.n_ubatch = std::max(params_.n_ubatch, need);
        check_draft_max(params_.draft_max, spec_);
        draft_max_ = params_.draft_max < 0 ? spec_.max_draft() : params_.draft_max;
        window = DFlashDrafter::plan_window(spec_, params_);  // a bad draft_window fails before any context
    } else {
        draft_max_ = 0;
        if (params_.draft_window > 0) {
            throw InvalidArgument("draft_window=" + std::to_string(params_.draft_window) +
                                  " limits a drafter's context, but no drafter is loaded: pass draft= or leave "
                                  "draft_window unset");
        }
    }
    check_speculative_list();
    if (mtp_listed()) {
        MtpDrafter::check_target(*target_);  // before any context is made
        mtp_n_max_ = params_.draft_max < 0 ? MtpDrafter::default_n_max() : params_.draft_max;
        const int32_t need = (1 + mtp_n_max_) * params_.n_seq;  // a verification batch of every sequence
        params_.n_batch = std::max(params_.n_batch, need);
        params_.n_ubatch = std::max(params_.n_ubatch, need);
        draft_max_ = mtp_n_max_;
    }
    if (std::any_of(params_.speculative.begin(), params_.speculative.end(), is_ngram_type)) {
        ngram_ = std::make_unique<NgramDrafters>(params_.speculative, params_.ngram, params_.n_seq);
    }

    ensure_backend();
    create_target_context();
    if (drafter_) {
        dflash_ = std::make_unique<DFlashDrafter>(drafter_, spec_, params_, window, draft_max_, ctx_tgt_.get(),
                                                  static_cast<DecodeFailure&>(*this), fault_);
    }
    // before the target's first decode: it turns on the target's hidden-state output
    if (mtp_listed()) mtp_ = std::make_unique<MtpDrafter>(*target_, ctx_tgt_.get(), params_, std::max(1, mtp_n_max_));
    llama_set_abort_callback(ctx_tgt_.get(), &ContextPair::abort_callback, this);
    if (dflash_) llama_set_abort_callback(dflash_->ctx(), &ContextPair::abort_callback, this);
    if (mtp_) llama_set_abort_callback(mtp_->ctx(), &ContextPair::abort_callback, this);
    batch_tgt_.reset(llama_batch_ext_init(ctx_tgt_.get()));
    if (!batch_tgt_) throw Error("llama_batch_ext_init failed for the target");
    acceptor_ = std::make_unique<Acceptor>(ctx_tgt_.get(), target_->n_vocab(), static_cast<DecodeFailure&>(*this));
    seqs_.resize(static_cast<size_t>(params_.n_seq));
    for (Sequence& sq : seqs_) sq.sampler = std::make_unique<Sampler>(SamplingParams{}, target_->n_vocab());
}

ContextPair::~ContextPair() = default;

void ContextPair::check_speculative_list() const {
    // llama.cpp's --spec-type list; empty: the drafter alone when there is one
    const auto& types = params_.speculative;
    if (types.empty()) return;
    const bool none = types.size() == 1 && types[0] == "none";
    if (mtp_listed() && drafter_) {
        throw InvalidArgument(
            "speculative lists 'draft-mtp' but a DFlash drafter is loaded: llama.cpp tries MTP first, so the "
            "drafter would never draft; load the target alone for MTP, or list 'draft-dflash' instead");
    }
    const bool model = std::find(types.begin(), types.end(), "draft-dflash") != types.end() ||
                       std::find(types.begin(), types.end(), "draft-dspark") != types.end();
    if (model && !drafter_) {
        throw InvalidArgument(
            "speculative lists a model drafter ('draft-dflash') but no drafter is loaded: pass draft=");
    }
    // llama.cpp's name for this drafter's kind (its DSpark reading needs 'draft-dspark')
    const std::string name = spec_.kind == DrafterKind::DSpark ? "draft-dspark" : "draft-dflash";
    if (drafter_ && std::find(types.begin(), types.end(), name) == types.end()) {
        throw InvalidArgument("a " + spec_.describe() + " drafter is loaded but speculative " +
                              (none ? std::string("is ['none']") : "does not list '" + name + "'") + ": add '" + name +
                              "' to use it, or load the target alone");
    }
}

bool ContextPair::mtp_listed() const {
    return std::find(params_.speculative.begin(), params_.speculative.end(), "draft-mtp") != params_.speculative.end();
}

std::string ContextPair::drafter_description() const {
    if (drafter_) return spec_.describe();
    if (mtp_) return "mtp (the target's next-token-prediction head, draft length " + std::to_string(mtp_n_max_) + ")";
    return "";
}

void ContextPair::history_replaced(int32_t seq) {
    if (ngram_) ngram_->begin(seq, seqs_[static_cast<size_t>(seq)].history);
    if (mtp_) mtp_->begin(seq, seqs_[static_cast<size_t>(seq)].history);
}

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
    if (want == "recurrent-planes" && !drafter_ && !mtp_listed()) {
        throw InvalidArgument("rollback 'recurrent-planes' is sized by a drafter's block; this pair has none");
    }
    // State planes for every draft length up to the block (draft_max may change
    // between calls); llama.cpp clamps the request to 0 where the architecture
    // has no partial rollback.
    const bool planes = recurrent && (drafter_ || mtp_listed()) && (want == "auto" || want == "recurrent-planes");
    llama_context_params cp = context_params(params_, false);
    cp.n_rs_seq = planes ? static_cast<uint32_t>(max_draft()) : 0;
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
    // the drafter contexts and the acceptor reference the target's: free them first
    acceptor_.reset();
    mtp_.reset();
    dflash_.reset();
    batch_tgt_.reset();
    ctx_tgt_.reset();
    drafter_.reset();
    target_.reset();
    seqs_.clear();
}

const Sequence& ContextPair::seq_at(int32_t seq) const {
    require_open();
    if (seq < 0 || seq >= static_cast<int32_t>(seqs_.size())) {
        throw InvalidArgument("sequence " + std::to_string(seq) + " is out of range [0, " +
                              std::to_string(seqs_.size()) + ")");
    }
    return seqs_[static_cast<size_t>(seq)];
}

Sequence& ContextPair::seq_at(int32_t seq) {
    return const_cast<Sequence&>(static_cast<const ContextPair*>(this)->seq_at(seq));
}

namespace {

void forget(Sequence& s) {
    s.pending.reset();
    s.history.clear();
    s.prompt.clear();
    s.n_past = 0;
    s.n_cached = 0;
}

}  // namespace

void ContextPair::clear_memory() {
    if (ctx_tgt_) llama_memory_clear(llama_get_memory(ctx_tgt_.get()), true);
    if (dflash_) dflash_->clear();
    if (mtp_) mtp_->clear();
    for (Sequence& s : seqs_) forget(s);
}

void ContextPair::clear_sequence(int32_t seq) {
    // the id first: llama.cpp reads -1 as every sequence and asserts on ids out of its range
    Sequence& s = seq_at(seq);
    // removing a whole sequence cannot fail (llama.cpp refuses only partial removals)
    llama_memory_seq_rm(llama_get_memory(ctx_tgt_.get()), seq, -1, -1);
    if (dflash_) dflash_->clear(seq);
    if (mtp_) mtp_->clear(seq);
    forget(s);
}

void ContextPair::reset() {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    clear_memory();
}

void ContextPair::reset(int32_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    clear_sequence(seq);
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
    if (dflash_) add("drafter", dflash_->ctx());
    if (mtp_) add("drafter", mtp_->ctx());
    return rows;
}

void ContextPair::set_sampling(int32_t seq, const SamplingParams& params) {
    std::lock_guard<std::mutex> lock(mu_);
    seq_at(seq).sampler = std::make_unique<Sampler>(params, target_->n_vocab());
}

void ContextPair::set_grammar(int32_t seq, const GrammarSpec& spec) {
    std::lock_guard<std::mutex> lock(mu_);
    Sequence& s = seq_at(seq);
    s.grammar.reset();
    s.draft_grammar.reset();
    s.grammar_start.reset();
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
        s.grammar = std::make_unique<Grammar>(llama_model_get_vocab(target_->get()), spec, cache);
        s.grammar->set_stop(&ContextPair::grammar_stop, this);  // a long mask stops as a decode does
        s.grammar_start = s.grammar->clone();
        grammar_caches_.emplace_back(spec.gbnf, s.grammar->cache());
        if (grammar_caches_.size() > kGrammarCaches) grammar_caches_.erase(grammar_caches_.begin());
    }
}

std::vector<llama_token> ContextPair::tokens(int32_t seq) const {
    std::lock_guard<std::mutex> lock(mu_);
    const Sequence& s = seq_at(seq);
    std::vector<llama_token> out = s.history;
    if (s.pending) out.push_back(*s.pending);
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

bool ContextPair::grammar_stop(void* data) {
    auto* self = static_cast<ContextPair*>(data);
    return self->fault_.fire(FaultSite::GrammarMask) || abort_callback(data);
}

void ContextPair::fail_rollback(const std::string& what) {
    clear_memory();
    std::string msg = what;
    const std::string logged = take_thread_errors();
    if (!logged.empty()) msg += ": " + logged;
    throw RollbackError(msg + "; the context was reset, call prefill() again");
}

void ContextPair::fail_decode(const std::string& what, int32_t rc) {
    // a failed decode leaves the caches in an unknown state: start clean
    clear_memory();
    if (interrupt_.exchange(false)) {
        take_thread_errors();
        throw Interrupted(what + " was interrupted; the context was reset");
    }
    std::string msg = what + " failed (llama.cpp returned " + std::to_string(rc) + ")";
    // 1: no room in the KV cache, which only a unified one (shared by the sequences) runs out of
    if (rc == 1 && params_.kv_unified) {
        msg = "the context size has been exceeded: " + msg + ", the shared KV cache is full";
    }
    const std::string logged = take_thread_errors();
    if (!logged.empty()) msg += ": " + logged;
    msg += "; the context was reset, call prefill() again";
    throw DecodeError(msg);
}

void ContextPair::decode_target_batch() {
    const int32_t rc = fault_.fire(FaultSite::TargetDecode)
                           ? -1
                           : llama_process(ctx_tgt_.get(), LLAMA_PROCESS_TYPE_DECODE, batch_tgt_.get());
    if (rc != 0) fail_decode("target decode", rc);
}

int32_t ContextPair::keep_common_prefix(int32_t seq, const std::vector<llama_token>& tokens, int32_t n, bool defer) {
    Sequence& s = seqs_[static_cast<size_t>(seq)];
    // the longest prefix of the cached history that the new prompt repeats
    int32_t common = 0;
    const auto n_hist = static_cast<int32_t>(s.history.size());
    while (common < n && common < n_hist &&
           s.history[static_cast<size_t>(common)] == tokens[static_cast<size_t>(common)]) {
        ++common;
    }
    // a recurrent state cannot be cut back to an arbitrary position: it is kept
    // only when the whole history is a prefix (a conversation's next turn)
    const bool recurrent = rollback_ != RollbackKind::KvTrim;
    if (common == 0 || (recurrent && common < n_hist)) return 0;
    const llama_pos drafter_end = dflash_ ? dflash_->keep_prefix(seq, common, defer) : common;
    if (common < n_hist) {
        // K/V and the drafter's injected features are per position: drop the rest
        if (!llama_memory_seq_rm(llama_get_memory(ctx_tgt_.get()), seq, common, -1)) return 0;
        if (dflash_ && !dflash_->cut(seq, drafter_end)) return 0;
        if (mtp_ && !mtp_->remove(seq, common)) return 0;
    }
    s.history.resize(static_cast<size_t>(common));
    s.n_past = common;
    return common;
}

int32_t ContextPair::prefill_begin(int32_t seq, const std::vector<llama_token>& tokens, bool reuse, bool defer) {
    std::lock_guard<std::mutex> lock(mu_);
    Sequence& s = seq_at(seq);
    if (tokens.empty()) throw InvalidArgument("prefill needs at least one token");
    for (llama_token t : tokens) target_->check_token(t);
    const int32_t limit = n_ctx_seq();
    if (tokens.size() > static_cast<size_t>(limit) - 1) {
        const std::string where = params_.n_seq > 1 ? "a sequence's context holds " + std::to_string(limit) +
                                                          " (n_ctx " + std::to_string(params_.n_ctx) +
                                                          " / n_parallel " + std::to_string(params_.n_seq) + ")"
                                                    : "the context holds " + std::to_string(limit);
        throw ContextLimitError("prompt has " + std::to_string(tokens.size()) + " tokens but " + where + " (at most " +
                                std::to_string(limit - 1) + " prompt tokens leave room to generate)");
    }
    // a new generation: the grammar starts over
    if (s.grammar) s.grammar->assign_state(*s.grammar_start);
    const auto n = static_cast<int32_t>(tokens.size()) - 1;  // the last token stays pending
    const int32_t cached = reuse ? keep_common_prefix(seq, tokens, n, defer) : 0;
    if (cached == 0) clear_sequence(seq);
    s.pending.reset();
    s.prompt = tokens;
    s.defer_prompt = defer;
    s.n_cached = cached;
    if (s.n_past == n) {  // nothing left to evaluate
        s.pending = tokens.back();
        s.prompt.clear();
        history_replaced(seq);
    }
    return cached;
}

int32_t ContextPair::prefill_remaining(int32_t seq) const {
    std::lock_guard<std::mutex> lock(mu_);
    const Sequence& s = seq_at(seq);
    return s.prompt.empty() ? 0 : static_cast<int32_t>(s.prompt.size()) - 1 - s.n_past;
}

double ContextPair::prefill_some(const std::vector<int32_t>& seqs, int32_t budget) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    const auto t0 = Clock::now();
    last_check_ = t0;
    budget = std::min(budget, params_.n_batch);
    llama_batch_ext* b = batch_tgt_.get();
    llama_batch_ext_clear(b);
    std::vector<Span> spans;
    int32_t row = 0;
    for (int32_t seq : seqs) {
        Sequence& s = seq_at(seq);
        if (s.prompt.empty() || row >= budget) continue;
        const auto n = static_cast<int32_t>(s.prompt.size()) - 1;
        const int32_t m = std::min(budget - row, n - s.n_past);
        for (int32_t i = 0; i < m; ++i)
            add_token(b, seq, s.prompt[static_cast<size_t>(s.n_past + i)], s.n_past + i, false);
        spans.push_back({seq, row, m, s.n_past});
        row += m;
    }
    if (row == 0) return 0.0;
    std::vector<Span> now, later;  // the prompts' rows injected now, and deferred
    if (dflash_) {
        for (const Span& sp : spans) (seq_at(sp.seq).defer_prompt ? later : now).push_back(sp);
        std::vector<int32_t> flushed;  // none after prefill_begin; the prompt's rows follow them
        for (const Span& sp : now) flushed.push_back(sp.seq);
        dflash_->flush_deferred(flushed);
    }
    decode_target_batch();
    if (!now.empty()) dflash_->inject(now);
    if (!later.empty()) dflash_->defer(later);
    if (mtp_) {
        std::vector<MtpDrafter::Entry> entries;
        for (const Span& sp : spans) {
            const Sequence& s = seqs_[static_cast<size_t>(sp.seq)];
            for (int32_t i = 0; i < sp.n; ++i)
                entries.push_back({sp.seq, s.prompt[static_cast<size_t>(sp.pos0 + i)], sp.pos0 + i});
        }
        mtp_process(entries);
    }
    for (const Span& sp : spans) {
        Sequence& s = seqs_[static_cast<size_t>(sp.seq)];
        s.history.insert(s.history.end(), s.prompt.begin() + s.n_past, s.prompt.begin() + s.n_past + sp.n);
        s.n_past += sp.n;
        if (s.n_past == static_cast<int32_t>(s.prompt.size()) - 1) {
            s.pending = s.prompt.back();
            s.prompt.clear();
            history_replaced(sp.seq);
        }
    }
    return ms_since(t0);
}

double ContextPair::prefill(int32_t seq, const std::vector<llama_token>& tokens, bool reuse) {
    const auto t0 = Clock::now();
    prefill_begin(seq, tokens, reuse);
    while (prefill_remaining(seq) > 0) prefill_some({seq}, params_.n_batch);
    return ms_since(t0);
}

std::vector<float> ContextPair::score(const std::vector<llama_token>& tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    if (tokens.empty()) throw InvalidArgument("score needs at least one token");
    for (llama_token t : tokens) target_->check_token(t);
    if (tokens.size() > static_cast<size_t>(n_ctx_seq())) {
        throw ContextLimitError("score: " + std::to_string(tokens.size()) + " tokens do not fit in a context of " +
                                std::to_string(n_ctx_seq()));
    }
    clear_memory();
    const auto n = static_cast<int32_t>(tokens.size());
    const auto n_vocab = static_cast<size_t>(target_->n_vocab());
    std::vector<float> out(static_cast<size_t>(n) * n_vocab);
    const int32_t chunk = params_.n_batch;
    for (int32_t off = 0; off < n; off += chunk) {
        const int32_t m = std::min(chunk, n - off);
        llama_batch_ext_clear(batch_tgt_.get());
        for (int32_t i = 0; i < m; ++i)
            add_token(batch_tgt_.get(), 0, tokens[static_cast<size_t>(off + i)], off + i, true);
        decode_target_batch();
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
    if (mtp_) {
        // llama.cpp's MTP drafter fixes its length and confidence cut when it is made
        if (control.draft_max > mtp_n_max_) {
            throw InvalidArgument("draft_max=" + std::to_string(control.draft_max) +
                                  " exceeds the MTP draft length this pair was made with (" +
                                  std::to_string(mtp_n_max_) + "); create it with a larger draft_max");
        }
        if (control.draft_p_min > 0.0f) {
            throw InvalidArgument("draft_p_min=" + std::to_string(control.draft_p_min) +
                                  ": llama.cpp's MTP drafter has no per-step confidence cut; use draft_p_min=0");
        }
    }
    if (!drafter_) return;
    check_draft_max(control.draft_max, spec_);
    if (spec_.kind == DrafterKind::DSpark && !spec_.confidence_head && control.draft_p_min > 0.0f) {
        throw InvalidArgument("draft_p_min=" + std::to_string(control.draft_p_min) +
                              ": this DSpark drafter has no confidence head to cut its block on; use draft_p_min=0");
    }
}

}  // namespace pydflash
