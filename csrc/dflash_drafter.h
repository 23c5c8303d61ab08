// The DFlash drafter (drafter.h's three kinds): its own context on the
// drafter's weights, borrowing the target's embeddings and head. It drafts a
// block per sequence in one non-causal pass over [pending, mask x n], and its
// cache holds the target's layer features of every kept position (feature
// injection), deferred for steps that do not draft (injection.cpp), within a
// window of recent positions (draft_window.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "acceptor.h"
#include "decode_failure.h"
#include "drafter.h"
#include "fault.h"
#include "handles.h"
#include "model.h"
#include "pair_params.h"
#include "sampler.h"
#include "sequence.h"

namespace pydflash {

class DFlashDrafter {
public:
    // rows [row0, row0 + n) of the last target pass, injected for `seq` at pos0..
    struct Span {
        int32_t seq;
        int32_t row0;
        int32_t n;
        llama_pos pos0;
    };
    // One sequence's block: n tokens read after its pending token (at n_past).
    struct Request {
        int32_t seq;
        Sequence* s;
        int32_t n;
        const DraftControl* control;
        std::vector<llama_token>* out;
        std::vector<Distribution>* q;  // filled for rejection sampling
    };
    // The drafter's window: the pair's ring (0: none) and what the drafter sees (0: all).
    struct Window {
        int32_t ring = 0;
        int32_t view = 0;
    };

    // Checks params.draft_window against the drafter (InvalidArgument), before any context exists.
    static Window plan_window(const DraftSpec& spec, const PairParams& params);

    // Creates the drafter's context on `target` (the pair's, which outlives this) and
    // turns on the target's feature output: before the target's first decode.
    DFlashDrafter(std::shared_ptr<Model> drafter, const DraftSpec& spec, const PairParams& params, Window window,
                  int32_t draft_max, llama_context* target, DecodeFailure& fail, FaultPlan& fault);
    ~DFlashDrafter();
    DFlashDrafter(const DFlashDrafter&) = delete;
    DFlashDrafter& operator=(const DFlashDrafter&) = delete;

    llama_context* ctx() const { return ctx_.get(); }
    int32_t view() const { return view_; }

    // Every request's block in one drafter pass, each walked under the acceptor's
    // grammar mask; the blocks' rows leave the drafter's cache again.
    void draft(const std::vector<Request>& reqs, Acceptor& rules);
    // A calibration pass of `rows` (anchor + masks) on the empty sequence `seq`, timed (ms).
    double timed_pass(int32_t seq, int32_t rows);

    // feature injection (injection.cpp): the spans' rows of the last target pass now
    void inject(const std::vector<Span>& spans);
    // ... or when the drafter next drafts for the sequence (steps that do not use it)
    void defer(const std::vector<Span>& spans);
    void flush_deferred(const std::vector<int32_t>& seqs);
    int32_t n_deferred(int32_t seq) const { return deferred_[static_cast<size_t>(seq)].n; }
    // A prompt-cache cut at `common`: later deferred rows leave, the rest are injected
    // unless `defer`; returns where the drafter's cache must end (the next rows follow it).
    llama_pos keep_prefix(int32_t seq, llama_pos common, bool defer);
    // the drafter's part of a prompt-cache cut at `common`; false: llama.cpp refused the removal
    bool cut(int32_t seq, int32_t common);
    void remove(int32_t seq, llama_pos p0);  // the drafter's cache of `seq` from p0 on
    void clear();                            // every sequence's cache and deferred rows
    void clear(int32_t seq);

private:
    // kept rows of one sequence whose features wait: positions pos0.. of n rows
    struct Deferred {
        std::vector<float> rows;
        llama_pos pos0 = 0;
        int32_t n = 0;
        void drop() {
            rows.clear();
            pos0 = 0;
            n = 0;
        }
    };

    // The block of one sequence from its rows of the drafter pass (row0: the first drafted row).
    std::vector<llama_token> read_block(Sequence& s, int32_t row0, int32_t n, const DraftControl& control,
                                        std::vector<Distribution>& q, Acceptor& rules);
    // DFlash2: the block walked on the selector lattice of rows row0 + 1.. (tokens only).
    std::vector<llama_token> read_lattice(Sequence& s, int32_t row0, int32_t n, const DraftControl& control);
    const float* nextn_row(int32_t row);  // the drafter's nextn output of a row of the last pass
    void inject_rows(const std::vector<Span>& spans, const std::function<void(size_t, int32_t, float*)>& fill);
    void cut_deferred(Deferred& d, llama_pos end);  // a prompt-cache cut: positions >= end leave
    std::vector<const float*> target_features();    // per layer id: the last target pass's rows
    size_t feature_width() const;                   // floats per injected row
    // rows a sequence defers at most (then injected): one drafter ubatch, within
    // kDeferredBytes of features and never under kMinDeferred rows
    int32_t max_deferred() const;
    static constexpr size_t kDeferredBytes = size_t{4} << 20;
    static constexpr int32_t kMinDeferred = 64;
    uint32_t drafter_n_ctx(uint32_t full) const;  // the drafter context's size under the ring
    // drops positions the ring no longer keeps; per span, the first position to inject
    std::vector<llama_pos> trim_window(const std::vector<Span>& spans);
    int32_t n_ctx_seq() const { return params_.kv_unified ? params_.n_ctx : params_.n_ctx / params_.n_seq; }

    std::shared_ptr<Model> model_;  // declared before ctx_: freed after it
    DraftSpec spec_;
    PairParams params_;
    int32_t draft_max_;
    int32_t window_;  // the ring's width (draft_window.cpp); 0: no ring
    int32_t view_;    // what the drafter sees: window_ or its own sliding window; 0: all
    llama_context* target_;
    int32_t n_vocab_;  // the target's: drafted ids are target ids
    DecodeFailure& fail_;
    FaultPlan& fault_;
    ContextPtr ctx_;
    BatchPtr batch_;
    int32_t max_deferred_ = kMinDeferred;  // max_deferred(), computed once
    std::vector<Deferred> deferred_;       // per sequence
    std::vector<float> features_;
    Distribution dist_;  // q of one row
};

}  // namespace pydflash
