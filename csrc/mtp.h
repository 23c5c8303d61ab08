// llama.cpp's MTP drafter (--spec-type draft-mtp, common/speculative.cpp): the
// target's own next-token-prediction head, run in a second context on the
// target's weights (LLAMA_CONTEXT_TYPE_MTP). It pairs each token with the
// target's last hidden state before it, so it is fed after every target decode
// (process) and told how much of each verified draft was kept (accept); drafts
// are tokens only (no q), one head decode per drafted token.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "handles.h"
#include "llama.h"
#include "model.h"
#include "pair_params.h"

struct common_speculative;
struct common_batch;
struct common_params_speculative;

namespace pydflash {

class MtpDrafter {
public:
    // One token of a target decode, in batch order.
    struct Entry {
        int32_t seq;
        llama_token token;
        llama_pos pos;
    };
    // One sequence's draft request: at most n_max tokens after `last` (at pos0).
    struct Request {
        int32_t seq;
        llama_token last;
        llama_pos pos0;
        const std::vector<llama_token>* history;
        int32_t n_max;
        std::vector<llama_token>* out;
    };

    // DraftCompatibilityError / InvalidArgument naming what the target lacks.
    static void check_target(const Model& target);
    // llama.cpp's default draft length for MTP (its --spec-draft-n-max).
    static int32_t default_n_max();

    // n_max: the longest draft (fixed here, as in llama.cpp). Must be created before
    // the target's first decode (it turns on the target's hidden-state output).
    MtpDrafter(const Model& target, llama_context* ctx_tgt, const PairParams& params, int32_t n_max);
    ~MtpDrafter();
    MtpDrafter(const MtpDrafter&) = delete;
    MtpDrafter& operator=(const MtpDrafter&) = delete;

    llama_context* ctx() const { return ctx_.get(); }
    int32_t n_max() const { return n_max_; }

    // After every target decode except a replay (its rows' pairs were fed when they
    // were verified): the decoded tokens, each sequence's contiguous. False: a head
    // decode failed.
    bool process(const std::vector<Entry>& entries);
    void begin(int32_t seq, const std::vector<llama_token>& history);
    // Drafts every request in shared head decodes; the drafted positions are removed
    // from the head's cache again (they are re-fed by process once verified).
    void draft(std::vector<Request>& reqs);
    // n_accepted tokens of the last verified batch of `seq` were kept.
    void accept(int32_t seq, int32_t n_accepted);
    bool remove(int32_t seq, llama_pos p0);  // the head's cache of `seq` from p0 on
    // Emptied caches; once every sequence is empty the drafter starts over, so that a
    // generation from an empty cache drafts as llama.cpp's loop does from its start
    // (its hidden row carried from the last batch is private and cannot be reset alone).
    void clear();
    void clear(int32_t seq);

private:
    void restart();

    int32_t n_max_;
    ContextPtr ctx_;
    std::unique_ptr<common_batch> mirror_;           // the target decode, as llama.cpp's process() reads it
    common_speculative* spec_ = nullptr;             // freed before ctx_ (its samplers are attached to it)
    std::unique_ptr<common_params_speculative> sp_;  // how spec_ is made
    std::vector<bool> drafted_;                      // per sequence: the head has drafted for it
    std::vector<bool> empty_;                        // per sequence: nothing fed since it was cleared
};

}  // namespace pydflash
