#include "mtp.h"

#include <algorithm>
#include <string>

#include "backend.h"
#include "common.h"
#include "errors.h"
#include "speculative.h"

namespace pydflash {

void MtpDrafter::check_target(const Model& target) {
    const std::string arch = target.architecture();
    const std::string what = target.path() + " (architecture '" + arch + "')";
    const int32_t n_nextn = llama_model_n_layer_nextn(target.get());
    if (n_nextn <= 0) {
        throw DraftCompatibilityError(what + " has no next-token-prediction layers ('" + arch +
                                      ".nextn_predict_layers' is missing or 0), which speculative type 'draft-mtp' "
                                      "drafts with: use a target converted with its MTP head (Qwen3.5/3.6), a DFlash "
                                      "drafter (draft=...) or the n-gram types");
    }
    // llama.cpp's MTP graphs differ per architecture; these are the ones checked here
    // (qwen35*.cpp asserts exactly one head, which would abort the process)
    if (arch != "qwen35" && arch != "qwen35moe") {
        throw DraftCompatibilityError(what +
                                      ": pydflash drafts with MTP heads of 'qwen35' and 'qwen35moe' targets "
                                      "(Qwen3.5/3.6) only; use a DFlash drafter or the n-gram types");
    }
    if (n_nextn != 1) {
        throw DraftCompatibilityError(what + " has " + std::to_string(n_nextn) +
                                      " next-token-prediction layers; llama.cpp's " + arch +
                                      " MTP graph runs exactly one");
    }
    if (!target.mtp_loaded()) {
        throw InvalidArgument(what +
                              " was loaded without its MTP layers: load it with ModelParams(load_mtp=True) "
                              "(Llama does when speculative lists 'draft-mtp')");
    }
}

int32_t MtpDrafter::default_n_max() {
    static const common_params_speculative d;
    return d.draft.n_max;
}

MtpDrafter::MtpDrafter(const Model& target, llama_context* ctx_tgt, const PairParams& params, int32_t n_max)
    : n_max_(n_max),
      drafted_(static_cast<size_t>(params.n_seq), false),
      empty_(static_cast<size_t>(params.n_seq), true) {
    check_target(target);
    // the head context as llama.cpp's common_speculative_init_result makes it
    llama_context_params cp = context_params(params, true);
    cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    // the target's cache, plus room for every sequence's draft: the head drafts its whole
    // length even where fewer tokens fit the sequence's share (what is kept is cut)
    cp.n_ctx = llama_n_ctx(ctx_tgt) + static_cast<uint32_t>(params.n_seq * n_max);
    cp.n_rs_seq = 0;
    cp.ctx_other = ctx_tgt;
    cp.n_outputs_max = static_cast<uint32_t>(params.n_seq);  // one drafted row per sequence per decode
    cp.n_outputs_max_per_seq = 1;
    take_thread_errors();
    ctx_.reset(llama_init_from_model(target.get(), cp));
    if (!ctx_) {
        throw ModelLoadError(target.path() + ": failed to create the MTP head's context: " + take_thread_errors());
    }
    mirror_ = std::make_unique<common_batch>(ctx_tgt);
    sp_ = std::make_unique<common_params_speculative>();
    sp_->types = {COMMON_SPECULATIVE_TYPE_DRAFT_MTP};
    sp_->draft.n_max = n_max;
    sp_->draft.n_min = 0;  // draft_min is applied per step by the pair
    sp_->draft.p_min = 0.0f;
    sp_->draft.ctx_tgt = ctx_tgt;
    sp_->draft.ctx_dft = ctx_.get();
    restart();
}

MtpDrafter::~MtpDrafter() { common_speculative_free(spec_); }

void MtpDrafter::restart() {
    common_speculative_free(spec_);  // first: it detaches its samplers from the context
    spec_ = common_speculative_init(*sp_, static_cast<uint32_t>(drafted_.size()));
    if (spec_ == nullptr) throw Error("llama.cpp could not create the 'draft-mtp' drafter");
    std::fill(drafted_.begin(), drafted_.end(), false);
}

bool MtpDrafter::process(const std::vector<Entry>& entries) {
    mirror_->clear();
    for (const Entry& e : entries) {
        mirror_->add(e.token, e.pos, e.seq, false);
        empty_[static_cast<size_t>(e.seq)] = false;
    }
    return common_speculative_process(spec_, *mirror_);
}

void MtpDrafter::begin(int32_t seq, const std::vector<llama_token>& history) {
    common_speculative_begin(spec_, seq, history);
}

void MtpDrafter::draft(std::vector<Request>& reqs) {
    for (Request& r : reqs) {
        r.out->clear();
        // n_max > 0 truncates what the head drafted (it drafts its own n_max); 0 would not
        common_speculative_get_draft_params(spec_, r.seq) = {r.n_max > 0, r.n_max, r.pos0, r.last, r.history, r.out};
    }
    common_speculative_draft(spec_);
    llama_memory_t mem = llama_get_memory(ctx_.get());
    for (const Request& r : reqs) {
        if (!r.out->empty()) drafted_[static_cast<size_t>(r.seq)] = true;
        // the drafted positions' K/V came from the head's own guesses: process() re-feeds
        // them with the target's hidden states once verified (llama.cpp's loop does the same)
        llama_memory_seq_rm(mem, r.seq, r.pos0, -1);
    }
}

void MtpDrafter::accept(int32_t seq, int32_t n_accepted) {
    // llama.cpp asserts (aborts) on a kept draft before the head ever drafted for the
    // sequence (another source's, an external one); the head then keeps the batch's
    // last hidden state, which changes later drafts only, never the output
    if (!drafted_[static_cast<size_t>(seq)] && n_accepted > 0) return;
    common_speculative_accept(spec_, seq, static_cast<uint16_t>(std::clamp(n_accepted, 0, 65535)));
}

bool MtpDrafter::remove(int32_t seq, llama_pos p0) {
    return llama_memory_seq_rm(llama_get_memory(ctx_.get()), seq, p0, -1);
}

void MtpDrafter::clear() {
    llama_memory_clear(llama_get_memory(ctx_.get()), true);
    std::fill(empty_.begin(), empty_.end(), true);
    restart();
}

void MtpDrafter::clear(int32_t seq) {
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), seq, -1, -1);
    if (empty_[static_cast<size_t>(seq)]) return;  // nothing to start over from
    empty_[static_cast<size_t>(seq)] = true;
    if (std::all_of(empty_.begin(), empty_.end(), [](bool e) { return e; })) restart();
}

}  // namespace pydflash
