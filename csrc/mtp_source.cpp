// The target's MTP head as a draft source (draft_source.h, mtp.h): its length is
// fixed at creation, as in llama.cpp; it drafts token by token for the steps that
// ask for a model draft, and is fed every target pass of new tokens.
#include <algorithm>
#include <memory>
#include <string>

#include "draft_sources.h"
#include "errors.h"
#include "mtp.h"

namespace pydflash {
namespace {

class MtpSource final : public DraftSource {
public:
    MtpSource(const Model& target, PairParams& params) {
        MtpDrafter::check_target(target);  // before any context is made
        n_max_ = params.draft_max < 0 ? MtpDrafter::default_n_max() : params.draft_max;
        const int32_t need = (1 + n_max_) * params.n_seq;  // a verification batch of every sequence
        params.n_batch = std::max(params.n_batch, need);
        params.n_ubatch = std::max(params.n_ubatch, need);
    }

    void attach(const TargetLink& t) override {
        // before the target's first decode: it turns on the target's hidden-state output
        head_ = std::make_unique<MtpDrafter>(t.model, t.ctx, t.params, std::max(1, n_max_));
        fail_ = &t.fail;
        fault_ = &t.fault;
    }
    void detach() override { head_.reset(); }
    void describe(DraftInfo& info) const override {
        info.sources.push_back(DraftKind::DraftMtp);
        info.model = DraftKind::DraftMtp;
        info.kind = "mtp";
        info.description = "mtp (the target's next-token-prediction head, draft length " + std::to_string(n_max_) + ")";
        info.identity = "the target's MTP head";
        info.max_draft = n_max_;
        info.default_draft_max = n_max_;
    }
    llama_context* context() const override { return head_ ? head_->ctx() : nullptr; }

    void begin(int32_t seq, const std::vector<llama_token>& history) override { head_->begin(seq, history); }
    bool keep_prefix(int32_t seq, llama_pos common, bool cut, bool /*defer*/) override {
        return !cut || head_->remove(seq, common);
    }
    void clear() override {
        if (head_) head_->clear();
    }
    void clear(int32_t seq) override {
        if (head_) head_->clear(seq);
    }

    void check(const DraftRequest& r) const override;
    void draft(DraftRound& round) override;
    bool decoded(const std::vector<TargetRows>& rows) override;
    // whoever drafted: the head keeps the last kept row's state
    void accept(int32_t seq, int32_t n_accepted, bool /*mine*/) override { head_->accept(seq, n_accepted); }
    void commit(const DraftRequest& r, llama_pos n_past) override { head_->remove(r.seq, n_past); }

private:
    int32_t n_max_ = 0;  // the head's draft length
    std::unique_ptr<MtpDrafter> head_;
    DecodeFailure* fail_ = nullptr;
    FaultPlan* fault_ = nullptr;
};

void MtpSource::check(const DraftRequest& r) const {
    if (r.external != nullptr) return;
    // llama.cpp's MTP drafter fixes its length and confidence cut when it is made
    const DraftControl& control = *r.control;
    if (control.draft_max > n_max_) {
        throw InvalidArgument("draft_max=" + std::to_string(control.draft_max) +
                              " exceeds the MTP draft length this pair was made with (" + std::to_string(n_max_) +
                              "); create it with a larger draft_max");
    }
    if (control.draft_p_min > 0.0f) {
        throw InvalidArgument("draft_p_min=" + std::to_string(control.draft_p_min) +
                              ": llama.cpp's MTP drafter has no per-step confidence cut; use draft_p_min=0");
    }
}

void MtpSource::draft(DraftRound& round) {
    std::vector<MtpDrafter::Request> reqs;
    std::vector<DraftRequest*> mine;
    for (DraftRequest* r : round.requests()) {
        if (r->block == 0 || !r->open()) continue;
        // the head drafts its fixed length; what is kept is cut to the step's length and
        // the tokens the generation has left (llama.cpp's n_max per request)
        const int32_t budget = r->control->budget;
        const int32_t n = budget >= 0 ? std::min(r->block, budget) : r->block;
        reqs.push_back({r->seq, *r->s->pending, r->s->n_past, &r->s->history, n, &r->draft});
        mine.push_back(r);
    }
    if (reqs.empty()) return;
    head_->draft(reqs);
    for (DraftRequest* r : mine) {
        if (static_cast<int32_t>(r->draft.size()) < r->control->draft_min) r->draft.clear();
        // tokens only: at temperature > 0 they are verified as one-hot drafts (q stays empty)
        if (!r->draft.empty()) r->kind = DraftKind::DraftMtp;
    }
}

bool MtpSource::decoded(const std::vector<TargetRows>& rows) {
    // the head pairs each decoded token with the target's hidden state before it
    std::vector<MtpDrafter::Entry> entries;
    for (const TargetRows& r : rows) {
        if (r.n > 0) entries.push_back({r.seq, r.first, r.pos0});
        for (int32_t i = 1; i < r.n; ++i) entries.push_back({r.seq, r.rest[i - 1], r.pos0 + i});
    }
    if (entries.empty()) return false;
    const bool ok = !fault_->fire(FaultSite::DrafterDecode) && head_->process(entries);
    if (!ok) fail_->fail_decode("MTP head decode", -1);
    return true;
}

}  // namespace

std::unique_ptr<DraftSource> make_mtp_source(const Model& target, PairParams& params) {
    return std::make_unique<MtpSource>(target, params);
}

}  // namespace pydflash
