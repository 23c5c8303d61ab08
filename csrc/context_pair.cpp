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

}  // namespace

ContextPair::ContextPair(std::shared_ptr<Model> target, std::shared_ptr<Model> drafter, const PairParams& params)
    : target_(std::move(target)) {
    if (!target_) throw InvalidArgument("a target model is required");
    PairParams& p = info_.params;
    p = params;
    p.validate();  // refuse bad options before any work
    p.n_batch = std::min(p.n_batch, p.n_ctx);
    p.n_ubatch = std::min(p.n_ubatch, p.n_batch);
    // each source checks its settings (and sizes the batches) before any context is made
    sources_ = std::make_unique<DraftSources>(*target_, std::move(drafter), p);
    info_.draft = sources_->info();

    ensure_backend();
    create_target_context();
    acceptor_ = std::make_unique<Acceptor>(ctx_tgt_.get(), target_->n_vocab(), static_cast<DecodeFailure&>(*this));
    // before the target's first decode: a drafter turns on the target's feature output
    sources_->attach({*target_, ctx_tgt_.get(), p, *acceptor_, static_cast<DecodeFailure&>(*this), fault_});
    llama_set_abort_callback(ctx_tgt_.get(), &ContextPair::abort_callback, this);
    for (llama_context* ctx : sources_->contexts()) llama_set_abort_callback(ctx, &ContextPair::abort_callback, this);
    batch_tgt_.reset(llama_batch_ext_init(ctx_tgt_.get()));
    if (!batch_tgt_) throw Error("llama_batch_ext_init failed for the target");
    seqs_.resize(static_cast<size_t>(p.n_seq));
    for (Sequence& sq : seqs_) sq.sampler = std::make_unique<Sampler>(SamplingParams{}, target_->n_vocab());
    const int32_t window = info_.draft.window;
    info_.fingerprint = "target: " + describe_model(*target_) + "; drafter: " + info_.draft.identity + "; rollback " +
                        rollback_name(info_.rollback) + ", n_rs_seq " + std::to_string(info_.n_rs_seq) +
                        (window > 0 ? ", draft window " + std::to_string(window) : "");
}

ContextPair::~ContextPair() = default;

void ContextPair::create_target_context() {
    const std::string& want = info_.params.rollback;
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
    const bool model = sources_->has_model();  // a model drafter's block sizes the planes
    if (want == "recurrent-planes" && !model) {
        throw InvalidArgument("rollback 'recurrent-planes' is sized by a drafter's block; this pair has none");
    }
    // State planes for every draft length up to the block (draft_max may change
    // between calls); llama.cpp clamps the request to 0 where the architecture
    // has no partial rollback.
    const bool planes = recurrent && model && (want == "auto" || want == "recurrent-planes");
    llama_context_params cp = context_params(info_.params, false);
    cp.n_rs_seq = planes ? static_cast<uint32_t>(sources_->info().max_draft) : 0;
    take_thread_errors();
    ctx_tgt_.reset(llama_init_from_model(target_->get(), cp));
    if (!ctx_tgt_) {
        throw ModelLoadError(target_->path() + ": failed to create the target context: " + take_thread_errors());
    }
    uint32_t& n_rs_seq = info_.n_rs_seq;
    n_rs_seq = llama_n_rs_seq(ctx_tgt_.get());
    if (!recurrent) {
        info_.rollback = RollbackKind::KvTrim;
    } else if (planes && n_rs_seq >= cp.n_rs_seq) {
        info_.rollback = RollbackKind::RecurrentPlanes;
    } else if (want == "recurrent-planes") {
        ctx_tgt_.reset();
        throw DraftCompatibilityError(arch + " has no partial recurrent-state rollback in llama.cpp (n_rs_seq " +
                                      std::to_string(cp.n_rs_seq) + " was clamped to " + std::to_string(n_rs_seq) +
                                      "); use rollback 'auto' or 'checkpoint'");
    } else {
        // save the recurrent state before each verification, restore + replay
        n_rs_seq = 0;
        info_.rollback = RollbackKind::Checkpoint;
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
    // the drafter contexts and the acceptor reference the target's: free them first (the
    // sources keep their settings: check() and info() answer as before)
    if (sources_) sources_->detach();
    acceptor_.reset();
    batch_tgt_.reset();
    ctx_tgt_.reset();
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
    sources_->clear();
    for (Sequence& s : seqs_) forget(s);
}

void ContextPair::clear_sequence(int32_t seq) {
    // the id first: llama.cpp reads -1 as every sequence and asserts on ids out of its range
    Sequence& s = seq_at(seq);
    // removing a whole sequence cannot fail (llama.cpp refuses only partial removals)
    llama_memory_seq_rm(llama_get_memory(ctx_tgt_.get()), seq, -1, -1);
    sources_->clear(seq);
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
    for (const llama_context* ctx : sources_->contexts()) add("drafter", ctx);
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

SequenceInfo ContextPair::sequence(int32_t seq) const {
    const Sequence& s = seq_at(seq);
    return {s.n_past, s.n_cached, sources_->n_waiting(seq), s.pending.has_value(), s.grammar != nullptr};
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
    if (rc == 1 && info_.params.kv_unified) {
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
    const bool recurrent = info_.rollback != RollbackKind::KvTrim;
    if (common == 0 || (recurrent && common < n_hist)) return 0;
    // K/V and the drafter's injected features are per position: drop the rest
    const bool cut = common < n_hist;
    if (cut && !llama_memory_seq_rm(llama_get_memory(ctx_tgt_.get()), seq, common, -1)) return 0;
    if (!sources_->keep_prefix(seq, common, cut, defer)) return 0;
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
    const PairParams& p = info_.params;
    if (tokens.size() > static_cast<size_t>(limit) - 1) {
        const std::string where = p.n_seq > 1
                                      ? "a sequence's context holds " + std::to_string(limit) + " (n_ctx " +
                                            std::to_string(p.n_ctx) + " / n_parallel " + std::to_string(p.n_seq) + ")"
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
        sources_->begin(seq, s.history);
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
    budget = std::min(budget, info_.params.n_batch);
    llama_batch_ext* b = batch_tgt_.get();
    llama_batch_ext_clear(b);
    std::vector<TargetRows> rows;  // the prompts' rows: their features wait where the prefill defers
    int32_t row = 0;
    for (int32_t seq : seqs) {
        Sequence& s = seq_at(seq);
        if (s.prompt.empty() || row >= budget) continue;
        const auto n = static_cast<int32_t>(s.prompt.size()) - 1;
        const int32_t m = std::min(budget - row, n - s.n_past);
        for (int32_t i = 0; i < m; ++i)
            add_token(b, seq, s.prompt[static_cast<size_t>(s.n_past + i)], s.n_past + i, false);
        const llama_token* first = s.prompt.data() + s.n_past;
        rows.push_back({seq, row, m, s.n_past, *first, first + 1, s.defer_prompt});
        row += m;
    }
    if (row == 0) return 0.0;
    decode_target_batch();
    sources_->kept(rows);
    sources_->decoded(rows);
    for (const TargetRows& r : rows) {
        Sequence& s = seqs_[static_cast<size_t>(r.seq)];
        s.history.insert(s.history.end(), s.prompt.begin() + s.n_past, s.prompt.begin() + s.n_past + r.n);
        s.n_past += r.n;
        if (s.n_past == static_cast<int32_t>(s.prompt.size()) - 1) {
            s.pending = s.prompt.back();
            s.prompt.clear();
            sources_->begin(r.seq, s.history);
        }
    }
    return ms_since(t0);
}

double prefill(ContextPair& pair, int32_t seq, const std::vector<llama_token>& tokens, bool reuse) {
    const auto t0 = Clock::now();
    pair.prefill_begin(seq, tokens, reuse);
    while (pair.prefill_remaining(seq) > 0) pair.prefill_some({seq}, pair.info().params.n_batch);
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
    const int32_t chunk = info_.params.n_batch;
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

void ContextPair::check(const DraftControl& control) const { sources_->check(control); }

}  // namespace pydflash
