// The DFlash drafter as a draft source (draft_source.h): its settings checked
// against the target and the pair's options before any context exists, then its
// context (DFlashDrafter); one drafter pass drafts the block of every sequence
// that asks for one, and the target's features of every kept row reach its cache
// now or when the sequence next drafts (injection.cpp).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "calibrate.h"
#include "dflash_drafter.h"
#include "draft_sources.h"
#include "errors.h"
#include "slot_state.h"

namespace pydflash {
namespace {

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

class DFlashSource final : public DraftSource {
public:
    DFlashSource(const Model& target, std::shared_ptr<Model> drafter, PairParams& params)
        : model_(std::move(drafter)), spec_(check_drafter(target, *model_)), n_seq_(params.n_seq) {
        // a verification batch is 1 + max_draft tokens per sequence; a drafter decode
        // (every sequence's block) must fit one ubatch
        const int32_t need = (1 + spec_.max_draft()) * params.n_seq;
        params.n_batch = std::max(params.n_batch, need);
        params.n_ubatch = std::max(params.n_ubatch, need);
        check_draft_max(params.draft_max, spec_);
        draft_max_ = params.draft_max < 0 ? spec_.max_draft() : params.draft_max;
        window_ = DFlashDrafter::plan_window(spec_, params);  // a bad draft_window fails before any context
    }

    void attach(const TargetLink& t) override {
        drafter_ =
            std::make_unique<DFlashDrafter>(model_, spec_, t.params, window_, draft_max_, t.ctx, t.fail, t.fault);
        rules_ = &t.rules;
    }
    void detach() override {
        drafter_.reset();
        model_.reset();
        rules_ = nullptr;
    }
    void describe(DraftInfo& info) const override;
    llama_context* context() const override { return drafter_ ? drafter_->ctx() : nullptr; }

    bool keep_prefix(int32_t seq, llama_pos common, bool cut, bool defer) override {
        const llama_pos end = drafter_->keep_prefix(seq, common, defer);
        return !cut || drafter_->cut(seq, end);
    }
    void clear() override {
        if (drafter_) drafter_->clear();
    }
    void clear(int32_t seq) override {
        if (drafter_) drafter_->clear(seq);
    }
    void sync(int32_t seq) override { drafter_->flush_deferred({seq}); }  // its cache holds every kept position
    int32_t n_waiting(int32_t seq) const override { return drafter_ ? drafter_->n_deferred(seq) : 0; }

    void check(const DraftRequest& r) const override;
    void prepare(DraftRound& round) override;
    void draft(DraftRound& round) override;
    bool kept(const std::vector<TargetRows>& rows) override;
    void commit(const DraftRequest& r, llama_pos n_past) override {
        // nothing of a step without a drafter pass lies past n_past in the drafter's cache
        // (its rows were deferred or injected below it); seq_rm scans every cell: not per plain step
        if (r.block > 0) drafter_->remove(r.seq, n_past);
    }

    std::vector<int32_t> calibration_rows(int32_t max_rows) const override;
    double timed_pass(int32_t seq, int32_t rows) override { return drafter_->timed_pass(seq, rows); }

private:
    DraftKind kind() const {
        return spec_.kind == DrafterKind::DSpark ? DraftKind::DraftDSpark : DraftKind::DraftDFlash;
    }

    std::shared_ptr<Model> model_;
    DraftSpec spec_;
    int32_t n_seq_;
    int32_t draft_max_ = 0;  // the block a step asks for by default
    DFlashDrafter::Window window_;
    std::unique_ptr<DFlashDrafter> drafter_;  // attach .. detach
    Acceptor* rules_ = nullptr;               // the grammar mask the blocks are walked under
};

void DFlashSource::describe(DraftInfo& info) const {
    info.sources.push_back(kind());
    info.model = kind();
    info.kind = drafter_kind_name(spec_.kind);
    info.description = spec_.describe();
    info.identity = describe_model(*model_);
    info.has_drafter = true;
    info.block_size = spec_.block_size;
    info.max_draft = spec_.max_draft();
    info.default_draft_max = draft_max_;
    info.pass_rows = spec_.lead_rows() + draft_max_;  // whatever it keeps of the block (draft)
    info.window = window_.view;
    info.spec = spec_;
}

void DFlashSource::check(const DraftRequest& r) const {
    if (r.external != nullptr) return;  // not bounded by the block
    const DraftControl& control = *r.control;
    check_draft_max(control.draft_max, spec_);
    if (spec_.kind == DrafterKind::DSpark && !spec_.confidence_head && control.draft_p_min > 0.0f) {
        throw InvalidArgument("draft_p_min=" + std::to_string(control.draft_p_min) +
                              ": this DSpark drafter has no confidence head to cut its block on; use draft_p_min=0");
    }
}

void DFlashSource::prepare(DraftRound& round) {
    // features deferred by steps that did not draft, before the drafter reads them
    std::vector<int32_t> drafting;
    for (const DraftRequest* r : round.requests()) {
        if (r->block > 0 && r->open() && drafter_->n_deferred(r->seq) > 0) drafting.push_back(r->seq);
    }
    drafter_->flush_deferred(drafting);
}

void DFlashSource::draft(DraftRound& round) {
    std::vector<DFlashDrafter::Request> reqs;
    std::vector<DraftRequest*> mine;
    for (DraftRequest* r : round.requests()) {
        if (r->block == 0 || !r->open()) continue;
        reqs.push_back({r->seq, r->s, r->block, r->control, &r->draft, &r->q});
        mine.push_back(r);
    }
    drafter_->draft(reqs, *rules_);  // one drafter pass over every sequence's block
    for (DraftRequest* r : mine) {
        // what is kept is cut to the tokens the generation has left (llama.cpp's budget)
        const int32_t budget = r->control->budget;
        if (budget >= 0 && static_cast<int32_t>(r->draft.size()) > budget) {
            r->draft.resize(static_cast<size_t>(budget));
            if (r->q.size() > r->draft.size()) r->q.resize(r->draft.size());
        }
        if (!r->draft.empty()) r->kind = kind();
    }
}

bool DFlashSource::kept(const std::vector<TargetRows>& rows) {
    // a sequence that drafted with the drafter this step is injected now (it will likely
    // draft again); the others' features wait for its next pass (injection.cpp)
    if (rows.empty()) return false;
    std::vector<DFlashDrafter::Span> now, later;
    std::vector<int32_t> flushed;  // rows that waited go first: the new ones follow them
    for (const TargetRows& r : rows) {
        const DFlashDrafter::Span sp{r.seq, r.row0, r.n, r.pos0};
        if (r.wait) {
            later.push_back(sp);
        } else {
            now.push_back(sp);
            flushed.push_back(r.seq);
        }
    }
    drafter_->flush_deferred(flushed);
    if (!now.empty()) drafter_->inject(now);
    if (!later.empty()) drafter_->defer(later);
    return true;
}

std::vector<int32_t> DFlashSource::calibration_rows(int32_t max_rows) const {
    // a drafter pass drafts every sequence's block at once: up to n_seq blocks
    // (DFlash2 / DSpark graphs slice a pass into equal blocks: one block of one sequence at most)
    const int32_t limit =
        spec_.equal_blocks() ? spec_.lead_rows() + std::max(1, draft_max_) : spec_.block_size * n_seq_;
    std::vector<int32_t> rows = calibration_sizes(std::min(max_rows, limit));
    if (spec_.equal_blocks()) {  // and never a block without a drafted row, which draft never sends
        const int32_t least = spec_.lead_rows() + 1;
        rows.erase(std::remove_if(rows.begin(), rows.end(), [&](int32_t r) { return r < least; }), rows.end());
    }
    return rows;
}

}  // namespace

std::unique_ptr<DraftSource> make_dflash_source(const Model& target, std::shared_ptr<Model> drafter,
                                                PairParams& params) {
    return std::make_unique<DFlashSource>(target, std::move(drafter), params);
}

}  // namespace pydflash
