// The pair: the target context and its drafters, driven together one
// speculative step at a time: plan the step, draft (DFlashDrafter, MtpDrafter,
// n-grams), verify every block in one target pass, accept (Acceptor) the
// agreeing prefix plus the target's own token, roll back the rest, inject the
// kept positions' features into the drafter and commit.
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

#include "acceptor.h"
#include "calibrate.h"
#include "decode_failure.h"
#include "dflash_drafter.h"
#include "drafter.h"
#include "fault.h"
#include "grammar.h"
#include "handles.h"
#include "model.h"
#include "mtp.h"
#include "ngram.h"
#include "pair_params.h"
#include "rollback.h"
#include "sampler.h"
#include "sequence.h"

namespace pydflash {

struct StepResult {
    std::vector<llama_token> tokens;     // new tokens: the accepted drafts, then the target's own
    std::vector<llama_token> drafted;    // what the drafter proposed
    std::vector<TokenLogprob> logprobs;  // one per token, when SamplingParams::logprobs
    std::string source;     // who drafted: "draft-dflash", "draft-mtp", an n-gram type, "external"; "": nobody
    int32_t seq = 0;        // the sequence this step advanced
    int32_t draft_max = 0;  // the block length this step asked for (after the block, context and
                            // draft_min rules; 0: plain decoding); n_drafted <= it (draft_p_min cuts)
    int32_t n_drafted = 0;
    int32_t n_accepted = 0;
    int32_t n_past = 0;          // tokens in the target cache after the step
    int32_t n_batch_seqs = 1;    // sequences that shared this step's passes
    double t_draft_ms = 0.0;     // drafter block pass (shared by the step's sequences)
    double t_verify_ms = 0.0;    // target verification pass (shared)
    double t_inject_ms = 0.0;    // feature injection into the drafter (shared)
    double t_sample_ms = 0.0;    // acceptance / sampling
    double t_rollback_ms = 0.0;  // removing rejected tokens (checkpoint: save, restore and replay)
    // non-empty: this sequence failed (a grammar that allows nothing more); its
    // caches were cleared and the others' steps are unaffected
    std::string error;
};

// One sequence's part of a batched step.
struct SeqStep {
    int32_t seq = 0;
    DraftControl control;
    std::optional<std::vector<llama_token>> external;  // verify these instead of the drafter's block
};

// llama.cpp's memory breakdown of one context, per buffer type (device).
struct MemoryRow {
    std::string role;    // "target" or "drafter"
    std::string buffer;  // ggml buffer type, e.g. "CPU", "CUDA0"
    size_t model = 0;    // weights
    size_t context = 0;  // KV cache / recurrent state
    size_t compute = 0;  // compute buffers
};

class ContextPair : private DecodeFailure {
public:
    ContextPair(std::shared_ptr<Model> target, std::shared_ptr<Model> drafter, const PairParams& params);
    ~ContextPair();
    ContextPair(const ContextPair&) = delete;
    ContextPair& operator=(const ContextPair&) = delete;

    // Evaluate `tokens` (all but the last, which is kept pending for the first
    // step) in sequence `seq`, from an empty cache; with `reuse`, the longest
    // prefix the caches already hold for it is kept (prompt cache; see
    // n_cached()). Returns the time spent in ms.
    double prefill(int32_t seq, const std::vector<llama_token>& tokens, bool reuse = false);
    // The same in parts, so that other sequences' steps run in between:
    // prefill_begin checks the prompt, keeps the cached prefix and returns its
    // length; each prefill_some evaluates at most `budget` more prompt tokens of
    // the given sequences in one target pass (a sequence whose prompt is done
    // has its pending token). Returns the time spent in ms. With `defer`, the
    // prompt's features wait in the sequence until it next drafts, as a plain
    // step's do (for a generation not expected to draft: one that ends without
    // drafting costs its drafter nothing).
    int32_t prefill_begin(int32_t seq, const std::vector<llama_token>& tokens, bool reuse, bool defer = false);
    double prefill_some(const std::vector<int32_t>& seqs, int32_t budget);
    int32_t prefill_remaining(int32_t seq) const;

    // One speculative step of one sequence. draft_max < 0 uses the pair's
    // default; 0 is plain target decoding. With `external`, those tokens are
    // verified instead of the drafter's block (any source: prompt lookup, tests).
    StepResult step(int32_t seq, const DraftControl& control, const std::optional<std::vector<llama_token>>& external);
    // One step of several sequences: one drafter pass drafts all their blocks,
    // one target pass verifies them all, then each is accepted, rolled back and
    // injected on its own. Results in the order of `steps`.
    std::vector<StepResult> step_batch(const std::vector<SeqStep>& steps);
    // Up to `n_steps` steps of one sequence in this loop (its budget shrinking by
    // the tokens taken), each as step_batch({step}) would take it. Stops after a
    // step that failed, one that brought the tokens to `n_tokens`, or one with an
    // end-of-generation token (`stop_at_eog`), and before the context is full.
    std::vector<StepResult> step_run(const SeqStep& step, int32_t n_steps, int32_t n_tokens, bool stop_at_eog);
    // step_run of several sequences stepping together (each drops out as it stops;
    // the others go on); the results per sequence, in the order of `steps`.
    std::vector<std::vector<StepResult>> step_runs(const std::vector<SeqStep>& steps, int32_t n_steps,
                                                   const std::vector<int32_t>& n_tokens, bool stop_at_eog);

    // Target logits for every position of `tokens` (row-major n x n_vocab),
    // evaluated from an empty cache; every sequence is left reset.
    std::vector<float> score(const std::vector<llama_token>& tokens);

    // Times target passes of the sizes calibration_sizes(max_rows) and drafter
    // block passes (up to n_seq blocks) in sequence `seq`, which must be empty and
    // is left empty; the median of `reps` passes each (calibrate.cpp).
    Calibration calibrate(int32_t seq, int32_t max_rows, int32_t reps);

    // InvalidArgument unless `control` suits this pair (draft_max within the block).
    void check(const DraftControl& control) const;

    std::vector<MemoryRow> memory() const;

    // One sequence's state (history, pending token, both contexts' memory of it)
    // to a file, and back into a sequence of a pair on the same models and
    // settings (checked first: InvalidArgument, the sequence untouched; a state
    // llama.cpp then refuses leaves it empty).
    void save_sequence(int32_t seq, const std::string& path);
    void load_sequence(int32_t seq, const std::string& path);

    void set_sampling(int32_t seq, const SamplingParams& params);
    // The grammar the next tokens of `seq` must follow, from its start (an empty
    // gbnf: none); every prefill starts it over. InvalidArgument when it does not parse.
    void set_grammar(int32_t seq, const GrammarSpec& spec);
    bool has_grammar(int32_t seq) const { return seq_at(seq).grammar != nullptr; }
    void reset();             // every sequence
    void reset(int32_t seq);  // one: its caches and history

    // Stop the running (or next) decode at the next graph node; the call in
    // progress throws Interrupted and the pair is reset. Any thread may call it.
    void interrupt() { interrupt_.store(true); }
    // Withdraw an interrupt that no decode has consumed yet.
    void clear_interrupt() { interrupt_.store(false); }
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
    int32_t n_seq() const { return params_.n_seq; }
    int32_t n_past(int32_t seq) const { return seq_at(seq).n_past; }
    int32_t n_cached(int32_t seq) const { return seq_at(seq).n_cached; }  // taken from the cache by the last prefill
    int32_t n_deferred(int32_t seq) const {                               // rows whose features wait
        seq_at(seq);
        return dflash_ ? dflash_->n_deferred(seq) : 0;
    }
    int32_t n_ctx() const { return params_.n_ctx; }
    // one sequence's limit; unified: all cells, shared (a decode that finds none fails them all)
    int32_t n_ctx_seq() const { return params_.kv_unified ? params_.n_ctx : params_.n_ctx / params_.n_seq; }
    int32_t block_size() const { return drafter_ ? spec_.block_size : 0; }
    // the longest model draft: the drafter's block, or the MTP head's length fixed at creation
    int32_t max_draft() const { return drafter_ ? spec_.max_draft() : mtp_n_max_; }
    std::string drafter_kind() const { return drafter_ ? drafter_kind_name(spec_.kind) : mtp_ ? "mtp" : ""; }
    std::string drafter_description() const;
    int32_t default_draft_max() const { return draft_max_; }
    // rows of one sequence's drafter pass, whatever it keeps of the block (draft_blocks);
    // 0: no drafter pass of fixed size (MTP drafts token by token)
    int32_t draft_pass_rows() const { return drafter_ ? spec_.lead_rows() + draft_max_ : 0; }
    // the positions before a block that the drafter sees (draft_window.cpp); 0: the whole context
    int32_t draft_window() const { return dflash_ ? dflash_->view() : 0; }
    bool has_pending(int32_t seq) const { return seq_at(seq).pending.has_value(); }
    std::vector<llama_token> tokens(int32_t seq) const;  // cached tokens + the pending one
    const DraftSpec& spec() const { return spec_; }
    RollbackKind rollback() const { return rollback_; }
    uint32_t n_rs_seq() const { return n_rs_seq_; }
    const PairParams& params() const { return params_; }

private:
    // rows [row0, row0 + n) of the last target pass, of `seq` at pos0..
    using Span = DFlashDrafter::Span;
    // one sequence's share of a batched step
    struct Work {
        int32_t seq;
        Sequence* s;
        const SeqStep* req;
        StepResult r;
        std::vector<llama_token> draft;
        std::vector<Distribution> q;
        int32_t k_draft = 0;  // block length asked of the drafter
        int32_t row = 0;      // first row of its batch in the verification pass
        bool checkpointed = false;
        int32_t n_keep = 0;
    };

    // the shared passes' times of one step (ms)
    struct StepTimes {
        double draft = 0.0;
        double save = 0.0;  // checkpoints
        double verify = 0.0;
        double rollback = 0.0;
        double inject = 0.0;
    };

    // the phases of step_batch
    std::vector<Work> plan(const std::vector<SeqStep>& steps);  // checks every request first
    std::vector<StepResult> run_step(std::vector<Work>& work);  // draft, verify, accept, commit
    void save_checkpoints(std::vector<Work>& work);
    void verify(std::vector<Work>& work);
    void roll_back_and_inject(std::vector<Work>& work, StepTimes& t);
    std::vector<StepResult> commit(std::vector<Work>& work, const StepTimes& t);

    void check_speculative_list() const;
    bool mtp_listed() const;  // speculative lists 'draft-mtp'
    // The MTP head's drafts of the steps that asked for a model draft.
    void draft_mtp(std::vector<Work>& work);
    // Feeds the head the tokens of the target pass just decoded (verify or prefill).
    void mtp_process(const std::vector<MtpDrafter::Entry>& entries);
    // A sequence's history was replaced (prefill done, slot loaded): the n-gram drafters start over.
    void history_replaced(int32_t seq);
    // The n-gram drafters' drafts, where they have one, replace the drafter's blocks.
    void draft_ngrams(std::vector<Work>& work, int32_t n_rows);
    std::string fingerprint() const;  // the models and settings a saved sequence needs
    const Sequence& seq_at(int32_t seq) const;
    Sequence& seq_at(int32_t seq);
    void require_open() const;
    void clear_memory();               // every sequence
    void clear_sequence(int32_t seq);  // one (both caches)
    // Keeps the cached prefix of `seq` shared with tokens[0..n) in both contexts
    // (all or nothing for a recurrent target); returns its length (0: caller clears).
    int32_t keep_common_prefix(int32_t seq, const std::vector<llama_token>& tokens, int32_t n, bool defer);
    // A target pass over the batch already filled in batch_tgt_.
    void decode_target_batch();
    // Picks the rollback for this target, creating the target context.
    void create_target_context();
    // The model drafter's blocks (DFlash or MTP) of the steps that asked for one.
    void draft_blocks(std::vector<Work>& work);
    // Removes a verified batch's rejected tail from the target (kv-trim, planes), or
    // restores the checkpoint ahead of a replay (returns true: replay needed).
    bool roll_back_target(Work& w, int32_t n_batch);
    [[noreturn]] void fail_decode(const std::string& what, int32_t rc) override;
    [[noreturn]] void fail_rollback(const std::string& what);
    static bool abort_callback(void* self);
    static bool grammar_stop(void* self);  // a grammar mask's stop check: abort_callback's

    std::shared_ptr<Model> target_;
    std::shared_ptr<Model> drafter_;
    PairParams params_;
    DraftSpec spec_;
    int32_t draft_max_ = 0;
    RollbackKind rollback_ = RollbackKind::KvTrim;
    uint32_t n_rs_seq_ = 0;                 // rollback depth of the target's state planes
    std::unique_ptr<NgramDrafters> ngram_;  // null: no n-gram type listed
    // the parts below reference the target context: declared after it, freed before it
    ContextPtr ctx_tgt_;
    BatchPtr batch_tgt_;
    std::unique_ptr<DFlashDrafter> dflash_;  // null: no DFlash drafter loaded
    int32_t mtp_n_max_ = 0;                  // the MTP head's draft length (0: no MTP)
    std::unique_ptr<MtpDrafter> mtp_;        // null: 'draft-mtp' not listed
    std::unique_ptr<Acceptor> acceptor_;
    std::vector<Sequence> seqs_;
    // the allowed-token caches of the last few grammars (by GBNF text), least recent first
    static constexpr size_t kGrammarCaches = 4;
    std::vector<std::pair<std::string, std::shared_ptr<MaskCache>>> grammar_caches_;
    mutable std::mutex mu_;
    std::atomic<bool> interrupt_{false};
    std::function<bool()> interrupt_check_;
    std::chrono::steady_clock::time_point last_check_{};
    FaultPlan fault_;  // tests only
};

}  // namespace pydflash
