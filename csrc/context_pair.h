// The target context and the DFlash drafter context, driven together one
// speculative step at a time: draft a block, verify it in one target pass,
// accept the agreeing prefix plus the target's own token, roll back the rest,
// and inject the target features of the kept positions into the drafter.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "drafter.h"
#include "fault.h"
#include "grammar.h"
#include "handles.h"
#include "model.h"
#include "pair_params.h"
#include "rollback.h"
#include "sampler.h"

namespace pydflash {

struct StepResult {
    std::vector<llama_token> tokens;     // new tokens: the accepted drafts, then the target's own
    std::vector<llama_token> drafted;    // what the drafter proposed
    std::vector<TokenLogprob> logprobs;  // one per token, when SamplingParams::logprobs
    int32_t n_drafted = 0;
    int32_t n_accepted = 0;
    int32_t n_past = 0;          // tokens in the target cache after the step
    double t_draft_ms = 0.0;     // drafter block pass
    double t_verify_ms = 0.0;    // target verification pass
    double t_inject_ms = 0.0;    // feature injection into the drafter
    double t_sample_ms = 0.0;    // acceptance / sampling
    double t_rollback_ms = 0.0;  // removing rejected tokens (checkpoint: save, restore and replay)
};

// llama.cpp's memory breakdown of one context, per buffer type (device).
struct MemoryRow {
    std::string role;    // "target" or "drafter"
    std::string buffer;  // ggml buffer type, e.g. "CPU", "CUDA0"
    size_t model = 0;    // weights
    size_t context = 0;  // KV cache / recurrent state
    size_t compute = 0;  // compute buffers
};

class ContextPair {
public:
    ContextPair(std::shared_ptr<Model> target, std::shared_ptr<Model> drafter, const PairParams& params);
    ~ContextPair();
    ContextPair(const ContextPair&) = delete;
    ContextPair& operator=(const ContextPair&) = delete;

    // Evaluate `tokens` (all but the last, which is kept pending for the first
    // step) from empty caches; with `reuse`, the longest prefix the caches
    // already hold is kept (prompt cache; see n_cached()). Returns the time
    // spent in ms.
    double prefill(const std::vector<llama_token>& tokens, bool reuse = false);

    // One speculative step. draft_max < 0 uses the pair's default; 0 is plain
    // target decoding. With `external`, those tokens are verified instead of
    // the drafter's block (any source: prompt lookup, tests).
    StepResult step(const DraftControl& control, const std::optional<std::vector<llama_token>>& external);

    // Target logits for every position of `tokens` (row-major n x n_vocab),
    // evaluated from an empty cache; the pair is left reset.
    std::vector<float> score(const std::vector<llama_token>& tokens);

    // InvalidArgument unless `control` suits this pair (draft_max within the block).
    void check(const DraftControl& control) const;

    std::vector<MemoryRow> memory() const;

    void set_sampling(const SamplingParams& params);
    // The grammar the next tokens must follow, from its start (an empty gbnf: none);
    // every prefill() starts it over. InvalidArgument when it does not parse.
    void set_grammar(const GrammarSpec& spec);
    bool has_grammar() const { return grammar_ != nullptr; }
    void reset();

    // Stop the running (or next) decode at the next graph node; the call in
    // progress throws Interrupted and the pair is reset. Any thread may call it.
    void interrupt() { interrupt_.store(true); }
    // Polled (at most every few ms) during decodes; true stops the decode.
    // The binding layer uses it to notice Ctrl-C while the GIL is released.
    void set_interrupt_check(std::function<bool()> fn) { interrupt_check_ = std::move(fn); }
    void close();  // free both contexts now; later calls raise
    // Tests only: the (after_calls + 1)-th later call at `site` fails (fault.h).
    void inject_fault(const std::string& site, int32_t after_calls) {
        std::lock_guard<std::mutex> lock(mu_);
        fault_.arm(site, after_calls);
    }

    bool closed() const { return !ctx_tgt_; }
    bool has_drafter() const { return drafter_ != nullptr; }
    int32_t n_past() const { return n_past_; }
    int32_t n_cached() const { return n_cached_; }  // prompt tokens the last prefill took from the cache
    int32_t n_ctx() const { return params_.n_ctx; }
    int32_t block_size() const { return drafter_ ? spec_.block_size : 0; }
    int32_t max_draft() const { return drafter_ ? spec_.max_draft() : 0; }
    int32_t default_draft_max() const { return draft_max_; }
    bool has_pending() const { return pending_.has_value(); }
    std::vector<llama_token> tokens() const;  // cached tokens + the pending one
    const DraftSpec& spec() const { return spec_; }
    RollbackKind rollback() const { return rollback_; }
    uint32_t n_rs_seq() const { return n_rs_seq_; }
    const PairParams& params() const { return params_; }

private:
    void require_open() const;
    void clear_memory();
    // Keeps the cached prefix shared with tokens[0..n) in both contexts (all or
    // nothing for a recurrent target); returns its length (0: caller clears).
    int32_t keep_common_prefix(const std::vector<llama_token>& tokens, int32_t n);
    void decode_target(const llama_token* tokens, int32_t n, llama_pos pos0, bool all_logits);
    void inject(int32_t n_rows, llama_pos pos0);
    // Picks the rollback for this target, creating the target context.
    void create_target_context();
    // Leaves [pending, draft[0..n_keep-2]] in the target's memory after a
    // verification of `batch`; `checkpointed` means the state was saved first.
    void roll_back_target(const std::vector<llama_token>& batch, int32_t n_keep, bool checkpointed);
    // Drafts up to n tokens; fills q with the drafter's distributions when the
    // sampler verifies by rejection.
    // The tokens to verify this step: `external`, the drafter's block, or none.
    std::vector<llama_token> choose_draft(const DraftControl& control,
                                          const std::optional<std::vector<llama_token>>& external, int32_t room,
                                          std::vector<Distribution>& q, StepResult& r);
    std::vector<llama_token> draft_block(int32_t n, const DraftControl& control, std::vector<Distribution>& q);
    // Accept/reject `draft` against the target rows of the last decode.
    std::vector<llama_token> accept(const std::vector<llama_token>& draft, const std::vector<Distribution>& q,
                                    bool external, int32_t& n_accepted, std::vector<TokenLogprob>& logprobs);
    std::vector<llama_token> recent_tokens() const;  // the penalty window before this step
    // Appends the logprob of `t` taken from the row `raw` (SamplingParams.logprobs).
    void note_logprob(const float* raw, llama_token t, bool have_dist, std::vector<TokenLogprob>& out) const;
    // The row with what the grammar disallows at -inf (a copy); null if it allows nothing.
    // `plain`: no penalties or bias (the chain sees the row in logit order).
    const float* constrain(const float* raw, Grammar& grammar, bool plain);
    // The greedy choice of a plain chain under the grammar (-1: it allows nothing).
    llama_token grammar_argmax(const float* raw, Grammar& grammar);
    [[noreturn]] void fail_decode(const std::string& what, int32_t rc);
    [[noreturn]] void fail_rollback(const std::string& what);
    static bool abort_callback(void* self);

    std::shared_ptr<Model> target_;
    std::shared_ptr<Model> drafter_;
    PairParams params_;
    DraftSpec spec_;
    int32_t draft_max_ = 0;
    RollbackKind rollback_ = RollbackKind::KvTrim;
    uint32_t n_rs_seq_ = 0;  // rollback depth of the target's state planes
    StateCheckpoint checkpoint_;
    ContextPtr ctx_tgt_;
    ContextPtr ctx_dft_;
    BatchPtr batch_tgt_;
    BatchPtr batch_dft_;
    std::vector<float> features_;
    Distribution dist_;
    std::unique_ptr<Sampler> sampler_;
    std::unique_ptr<Grammar> grammar_;        // null: unconstrained
    std::unique_ptr<Grammar> draft_grammar_;  // the copy the drafter walks (its state reset each step)
    std::unique_ptr<Grammar> grammar_start_;  // its state after the spec's prefill: each prefill() returns to it
    // the allowed-token caches of the last few grammars (by GBNF text), least recent first
    static constexpr size_t kGrammarCaches = 4;
    std::vector<std::pair<std::string, std::shared_ptr<MaskCache>>> grammar_caches_;
    std::vector<float> masked_;                         // a grammar-masked logits row
    std::vector<std::pair<float, llama_token>> order_;  // a row's tokens by logit (grammar scans)
    std::vector<llama_token> history_;                  // tokens in the target cache
    std::optional<llama_token> pending_;
    int32_t n_past_ = 0;
    int32_t n_cached_ = 0;
    mutable std::mutex mu_;
    std::atomic<bool> interrupt_{false};
    std::function<bool()> interrupt_check_;
    std::chrono::steady_clock::time_point last_check_{};
    FaultPlan fault_;  // tests only
};

}  // namespace pydflash
