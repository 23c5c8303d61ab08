// The pair's draft sources (draft_source.h) in llama.cpp's fixed priority order:
// the caller's draft first, then the n-gram types (in their own order), then the
// model drafter (the DFlash drafter or the MTP head); the first source with a
// non-empty draft wins a sequence's step. Made from the pair's options (the
// speculative list, the drafter file) and driven as one: adding a source is a class
// and a line in the constructor here, nothing in ContextPair.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "draft_source.h"

namespace pydflash {

// What one step's drafting cost (ms): the features the model pass needed first, and the pass.
struct DraftTimes {
    double prepare = 0.0;
    double draft = 0.0;
};

class DraftSources {
public:
    // Checks the speculative list against the drafter and each source's settings, before
    // any context exists, and grows params' batch sizes to a verification pass of every
    // sequence's longest draft. `drafter`: a DFlash drafter file (null: none).
    DraftSources(const Model& target, std::shared_ptr<Model> drafter, PairParams& params);
    ~DraftSources();
    DraftSources(const DraftSources&) = delete;
    DraftSources& operator=(const DraftSources&) = delete;

    // Every source's contexts, once the target's exists (before its first decode).
    void attach(const TargetLink& target);
    void detach();  // frees them (the pair is closed)
    const DraftInfo& info() const { return info_; }
    bool has_model() const { return model_ != nullptr; }  // a model drafter, whose block sizes rollback planes
    std::vector<llama_context*> contexts() const;
    llama_context* state_context() const;  // the context whose state a slot file holds as the drafter's

    // sequences (draft_source.h)
    void begin(int32_t seq, const std::vector<llama_token>& history);
    bool keep_prefix(int32_t seq, llama_pos common, bool cut, bool defer);
    void clear();
    void clear(int32_t seq);
    void sync(int32_t seq);
    int32_t n_waiting(int32_t seq) const;

    // InvalidArgument unless `control` suits a step without an external draft.
    void check(const DraftControl& control) const;
    // Checks one sequence's request of a step (InvalidArgument) and plans it: the
    // caller's draft that fits its `room` (positions left), or the model's block.
    void plan(DraftRequest& r, int32_t room) const;
    // Every source in priority order drafts for the requests still open.
    DraftTimes draft(DraftRound& round);
    bool decoded(const std::vector<TargetRows>& rows);  // true: a source worked on them
    bool kept(const std::vector<TargetRows>& rows);
    void accept(const DraftRequest& r, int32_t n_accepted);
    void commit(const DraftRequest& r, llama_pos n_past);

    // the model drafter's calibration passes (calibrate.cpp); empty: none
    std::vector<int32_t> calibration_rows(int32_t max_rows) const;
    double timed_pass(int32_t seq, int32_t rows);

private:
    // the block asked of the model drafter for a step with `room` positions left (0: none)
    int32_t block(const DraftControl& control, int32_t room) const;

    std::vector<std::unique_ptr<DraftSource>> srcs_;  // in priority order
    DraftSource* model_ = nullptr;                    // the model drafter among them; null: none
    std::vector<int32_t> last_;  // per sequence: the source of its last draft (llama.cpp's impl_last); -1: none
    DraftInfo info_;
};

// The sources, each in its own file.
std::unique_ptr<DraftSource> make_external_source();
// llama.cpp's n-gram types listed in `types` (ngram.cpp); null when none is.
std::unique_ptr<DraftSource> make_ngram_source(const std::vector<std::string>& types, const NgramParams& params,
                                               int32_t n_seq);
// The DFlash drafter `drafter` (checked against the target: DraftCompatibilityError).
std::unique_ptr<DraftSource> make_dflash_source(const Model& target, std::shared_ptr<Model> drafter,
                                                PairParams& params);
// The target's MTP head (speculative 'draft-mtp').
std::unique_ptr<DraftSource> make_mtp_source(const Model& target, PairParams& params);

}  // namespace pydflash
