// The pair's side of MTP drafting (mtp.h): which steps ask the head for a draft,
// and feeding it every target pass.
#include <algorithm>

#include "context_pair.h"

namespace pydflash {

void ContextPair::draft_mtp(std::vector<Work>& work) {
    std::vector<MtpDrafter::Request> reqs;
    for (Work& w : work) {
        if (w.k_draft == 0) continue;
        // the head drafts its fixed length; what is kept is cut to the step's length and
        // the tokens the generation has left (llama.cpp's n_max per request)
        const int32_t budget = w.req->control.budget;
        const int32_t n = budget >= 0 ? std::min(w.k_draft, budget) : w.k_draft;
        reqs.push_back({w.seq, *w.s->pending, w.s->n_past, &w.s->history, n, &w.draft});
    }
    if (reqs.empty()) return;
    mtp_->draft(reqs);
    for (Work& w : work) {
        if (w.k_draft == 0) continue;
        if (static_cast<int32_t>(w.draft.size()) < w.req->control.draft_min) w.draft.clear();
        if (w.draft.empty()) continue;
        // tokens only: at temperature > 0 they are verified as one-hot drafts (w.q stays empty)
        w.r.source = "draft-mtp";
        if (ngram_) ngram_->model_drafted(w.seq);
    }
}

void ContextPair::mtp_process(const std::vector<MtpDrafter::Entry>& entries) {
    if (entries.empty()) return;
    const bool ok = !fault_.fire(FaultSite::DrafterDecode) && mtp_->process(entries);
    if (!ok) fail_decode("MTP head decode", -1);
}

}  // namespace pydflash
