// The pair: the target context and its draft sources (draft_sources.h), driven
// together one speculative step at a time: plan the step, draft (each sequence's
// first source with a draft), verify every draft in one target pass, accept
// (Acceptor) the agreeing prefix plus the target's own token, roll back the rest,
// tell the sources what was kept and commit. The pair knows no source by kind.
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
#include "draft_sources.h"
#include "fault.h"
#include "grammar.h"
#include "handles.h"
#include "model.h"
#include "pair_params.h"
#include "rollback.h"
#include "sampler.h"
#include "sequence.h"
#include "slot_state.h"

namespace pydflash {

struct StepResult {
    std::vector<llama_token> tokens;     // new tokens: the accepted drafts, then the target's own
    std::vector<llama_token> drafted;    // what the drafter proposed
    std::vector<TokenLogprob> logprobs;  // one per token, when SamplingParams::logprobs
    DraftKind kind = DraftKind::None;    // who drafted (draft_kind_name: "draft-dflash", "ngram-mod", ...)
    int32_t seq = 0;                     // the sequence this step advanced
    int32_t draft_max = 0;               // the block length this step asked for (after the block, context and
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

// What the pair is, fixed at creation.
struct PairInfo {
    PairParams params;  // as given, batch sizes grown for the drafts
    RollbackKind rollback = RollbackKind::KvTrim;
    uint32_t n_rs_seq = 0;    // rollback depth of the target's state planes
    DraftInfo draft;          // its draft sources and model drafter
    std::string fingerprint;  // the models and settings a saved sequence needs (slot files)
};

// One sequence's counters (read without the pair's lock, as a running step changes them).
struct SequenceInfo {
    int32_t n_past = 0;
    int32_t n_cached = 0;    // prompt tokens the last prefill took from the cache
    int32_t n_deferred = 0;  // rows whose features wait for the drafter's next pass
    bool pending = false;    // a token to continue from
    bool grammar = false;
};

class ContextPair : private DecodeFailure {
public:
    ContextPair(std::shared_ptr<Model> target, std::shared_ptr<Model> drafter, const PairParams& params);
    ~ContextPair();
    ContextPair(const ContextPair&) = delete;
    ContextPair& operator=(const ContextPair&) = delete;

    // A prompt for sequence `seq`, in parts so that other sequences' steps run in
    // between (prefill() below: all at once): prefill_begin checks the prompt, keeps
    // the cached prefix (with `reuse`: the longest prefix the caches already hold
    // for it; see n_cached) and returns its length; each prefill_some evaluates at
    // most `budget` more prompt tokens of the given sequences in one target pass (a
    // sequence whose prompt is done has its pending token: the prompt's last) and
    // returns the time spent in ms. With `defer`, the prompt's features wait in the
    // sequence until it next drafts, as a plain step's do (for a generation not
    // expected to draft: one that ends without drafting costs its drafter nothing).
    int32_t prefill_begin(int32_t seq, const std::vector<llama_token>& tokens, bool reuse, bool defer = false);
    double prefill_some(const std::vector<int32_t>& seqs, int32_t budget);
    int32_t prefill_remaining(int32_t seq) const;

    // One step of several sequences: each sequence's draft from its first draft source
    // (draft_sources.h: the caller's, an n-gram's, the model drafter's block: all blocks
    // in one drafter pass), one target pass verifies them all, then each is accepted,
    // rolled back and injected on its own. Results in the order of `steps`.
    std::vector<StepResult> step_batch(const std::vector<SeqStep>& steps);
    // Up to `n_steps` steps of several sequences stepping together, each as
    // step_batch would take it (its budget shrinking by the tokens taken). A sequence
    // stops after a step that failed, one that brought its tokens to its `n_tokens`,
    // or one with an end-of-generation token (`stop_at_eog`), and before its context
    // is full; the others go on. The results per sequence, in the order of `steps`.
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

    // One sequence's state (history, pending token, both contexts' memory of it) for a
    // slot file (slot_state.h: save_sequence, load_sequence), and back into a sequence:
    // `read` gets what the state must match and checks it as it reads (InvalidArgument,
    // the sequence untouched); a state llama.cpp then refuses leaves it empty.
    SlotState save_state(int32_t seq);
    void load_state(int32_t seq, const std::function<SlotState(const SlotCheck&)>& read);

    void set_sampling(int32_t seq, const SamplingParams& params);
    // The grammar the next tokens of `seq` must follow, from its start (an empty
    // gbnf: none); every prefill starts it over. InvalidArgument when it does not parse.
    void set_grammar(int32_t seq, const GrammarSpec& spec);
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
    const PairInfo& info() const { return info_; }
    SequenceInfo sequence(int32_t seq) const;
    std::vector<llama_token> tokens(int32_t seq) const;  // cached tokens + the pending one

private:
    // one sequence's share of a batched step
    struct Work {
        DraftRequest d;  // its draft, from the first source that has one
        const SeqStep* req = nullptr;
        StepResult r;
        int32_t row = 0;  // first row of its batch in the verification pass
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
    std::vector<Work> plan(const std::vector<SeqStep>& steps, int32_t& n_rows);  // checks every request first
    std::vector<StepResult> run_step(std::vector<Work>& work, int32_t n_rows);   // draft, verify, accept, commit
    void save_checkpoints(std::vector<Work>& work);
    void verify(std::vector<Work>& work);
    void roll_back_and_inject(std::vector<Work>& work, StepTimes& t);
    std::vector<StepResult> commit(std::vector<Work>& work, const StepTimes& t);

    int32_t n_ctx_seq() const { return info_.params.n_ctx_seq(); }
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
    // Removes a verified batch's rejected tail from the target (kv-trim, planes), or
    // restores the checkpoint ahead of a replay (returns true: replay needed).
    bool roll_back_target(Work& w, int32_t n_batch);
    [[noreturn]] void fail_decode(const std::string& what, int32_t rc) override;
    [[noreturn]] void fail_rollback(const std::string& what);
    static bool abort_callback(void* self);
    static bool grammar_stop(void* self);  // a grammar mask's stop check: abort_callback's

    std::shared_ptr<Model> target_;
    PairInfo info_;
    // the parts below reference the target context: declared after it, freed before it
    ContextPtr ctx_tgt_;
    BatchPtr batch_tgt_;
    std::unique_ptr<Acceptor> acceptor_;
    std::unique_ptr<DraftSources> sources_;
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

// Conveniences over the pair's calls:
// All of a prompt in sequence `seq` (prefill_begin, then prefill_some until it is
// done); returns the time spent in ms.
double prefill(ContextPair& pair, int32_t seq, const std::vector<llama_token>& tokens, bool reuse = false);
// One speculative step of one sequence (draft_max < 0: the pair's default; 0: plain
// decoding; `external`: verify these tokens instead of a draft source's); a step that
// fails alone (its grammar) throws GrammarError.
StepResult step(ContextPair& pair, int32_t seq, const DraftControl& control,
                const std::optional<std::vector<llama_token>>& external);
// step_runs of one sequence.
std::vector<StepResult> step_run(ContextPair& pair, const SeqStep& step, int32_t n_steps, int32_t n_tokens,
                                 bool stop_at_eog);

}  // namespace pydflash
