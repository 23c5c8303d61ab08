#include "draft_sources.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "errors.h"

namespace pydflash {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

bool listed(const std::vector<std::string>& types, const char* name) {
    return std::find(types.begin(), types.end(), name) != types.end();
}

// Which model drafter the speculative list asks for, against what is loaded
// (`model`: the DFlash drafter's info; empty without one). The list is llama.cpp's
// --spec-type; empty: the drafter alone when there is one.
void check_speculative_list(const std::vector<std::string>& types, const DraftInfo& dflash) {
    if (types.empty()) return;
    const bool none = types.size() == 1 && types[0] == "none";
    const bool drafter = dflash.has_drafter;
    if (listed(types, "draft-mtp") && drafter) {
        throw InvalidArgument(
            "speculative lists 'draft-mtp' but a DFlash drafter is loaded: llama.cpp tries MTP first, so the "
            "drafter would never draft; load the target alone for MTP, or list 'draft-dflash' instead");
    }
    if ((listed(types, "draft-dflash") || listed(types, "draft-dspark")) && !drafter) {
        throw InvalidArgument(
            "speculative lists a model drafter ('draft-dflash') but no drafter is loaded: pass draft=");
    }
    // llama.cpp's name for this drafter's kind (its DSpark reading needs 'draft-dspark')
    const std::string name = draft_kind_name(dflash.model);
    if (drafter && !listed(types, name.c_str())) {
        throw InvalidArgument("a " + dflash.description + " drafter is loaded but speculative " +
                              (none ? std::string("is ['none']") : "does not list '" + name + "'") + ": add '" + name +
                              "' to use it, or load the target alone");
    }
}

// Drafts the caller gives a step (SeqStep::external): verified as given, ahead of every
// other source; not bounded by the drafter's block.
class ExternalSource final : public DraftSource {
public:
    void attach(const TargetLink& target) override {
        target_ = &target.model;
        n_batch_ = target.params.n_batch;
    }
    void detach() override { target_ = nullptr; }
    void describe(DraftInfo& info) const override { info.sources.push_back(DraftKind::External); }

    void check(const DraftRequest& r) const override {
        if (r.external == nullptr) return;
        for (llama_token t : *r.external) target_->check_token(t);
        if (r.external->size() + 1 > static_cast<size_t>(n_batch_)) {
            throw InvalidArgument("external draft of " + std::to_string(r.external->size()) +
                                  " tokens exceeds n_batch - 1 = " + std::to_string(n_batch_ - 1));
        }
    }

    void draft(DraftRound& round) override {
        for (DraftRequest* r : round.requests()) {
            if (r->external == nullptr || !r->open()) continue;
            r->draft.assign(r->external->begin(), r->external->begin() + r->n_external);
            r->kind = DraftKind::External;
        }
    }

private:
    const Model* target_ = nullptr;
    int32_t n_batch_ = 0;
};

}  // namespace

const char* draft_kind_name(DraftKind kind) {
    switch (kind) {
        case DraftKind::None: return "";
        case DraftKind::NgramSimple: return "ngram-simple";
        case DraftKind::NgramMapK: return "ngram-map-k";
        case DraftKind::NgramMapK4v: return "ngram-map-k4v";
        case DraftKind::NgramMod: return "ngram-mod";
        case DraftKind::NgramCache: return "ngram-cache";
        case DraftKind::DraftMtp: return "draft-mtp";
        case DraftKind::DraftDFlash: return "draft-dflash";
        case DraftKind::DraftDSpark: return "draft-dspark";
        case DraftKind::External: return "external";
    }
    return "?";
}

std::optional<DraftKind> draft_kind_of(const std::string& spec_type) {
    for (auto k : {DraftKind::NgramSimple, DraftKind::NgramMapK, DraftKind::NgramMapK4v, DraftKind::NgramMod,
                   DraftKind::NgramCache, DraftKind::DraftMtp, DraftKind::DraftDFlash, DraftKind::DraftDSpark}) {
        if (spec_type == draft_kind_name(k)) return k;
    }
    return std::nullopt;
}

int32_t DraftRound::room(const DraftRequest& r) const {
    // as long as the source likes, within the context, the batch and the budget
    int32_t cap = std::min(context_room(r), n_batch_ - (n_rows_ - r.rows()) - 1);
    if (r.control->budget >= 0) cap = std::min(cap, r.control->budget);
    return cap;
}

void DraftRound::take(DraftRequest& r, std::vector<llama_token> draft, DraftKind kind) {
    n_rows_ += static_cast<int32_t>(draft.size()) - r.block;
    r.block = 0;  // the model drafter's block is not needed
    r.draft = std::move(draft);
    r.kind = kind;
}

DraftSources::DraftSources(const Model& target, std::shared_ptr<Model> drafter, PairParams& params)
    : last_(static_cast<size_t>(params.n_seq), -1) {
    const std::vector<std::string>& types = params.speculative;
    std::unique_ptr<DraftSource> model;
    DraftInfo dflash;
    if (drafter) {
        model = make_dflash_source(target, std::move(drafter), params);
        model->describe(dflash);
    } else if (params.draft_window > 0) {
        throw InvalidArgument("draft_window=" + std::to_string(params.draft_window) +
                              " limits a drafter's context, but no drafter is loaded: pass draft= or leave "
                              "draft_window unset");
    }
    check_speculative_list(types, dflash);
    if (listed(types, "draft-mtp")) model = make_mtp_source(target, params);  // no drafter: checked above
    srcs_.push_back(make_external_source());
    if (auto ngram = make_ngram_source(types, params.ngram, params.n_seq)) srcs_.push_back(std::move(ngram));
    if (model) {
        model_ = model.get();
        srcs_.push_back(std::move(model));
    }
    for (const auto& src : srcs_) src->describe(info_);
}

DraftSources::~DraftSources() = default;

void DraftSources::attach(const TargetLink& target) {
    for (const auto& src : srcs_) src->attach(target);
}

void DraftSources::detach() {
    for (const auto& src : srcs_) src->detach();
}

std::vector<llama_context*> DraftSources::contexts() const {
    std::vector<llama_context*> out;
    for (const auto& src : srcs_) {
        if (llama_context* ctx = src->context()) out.push_back(ctx);
    }
    return out;
}

llama_context* DraftSources::state_context() const { return model_ ? model_->context() : nullptr; }

void DraftSources::begin(int32_t seq, const std::vector<llama_token>& history) {
    for (const auto& src : srcs_) src->begin(seq, history);
}

bool DraftSources::keep_prefix(int32_t seq, llama_pos common, bool cut, bool defer) {
    for (const auto& src : srcs_) {
        if (!src->keep_prefix(seq, common, cut, defer)) return false;
    }
    return true;
}

void DraftSources::clear() {
    for (const auto& src : srcs_) src->clear();
}

void DraftSources::clear(int32_t seq) {
    for (const auto& src : srcs_) src->clear(seq);
}

void DraftSources::sync(int32_t seq) {
    for (const auto& src : srcs_) src->sync(seq);
}

int32_t DraftSources::n_waiting(int32_t seq) const {
    int32_t n = 0;
    for (const auto& src : srcs_) n += src->n_waiting(seq);
    return n;
}

void DraftSources::check(const DraftControl& control) const {
    DraftRequest r;
    r.control = &control;
    control.validate();
    for (const auto& src : srcs_) src->check(r);
}

int32_t DraftSources::block(const DraftControl& c, int32_t room) const {
    int32_t k = c.draft_max < 0 ? info_.default_draft_max : c.draft_max;
    // the whole block is drafted even when fewer tokens are left (budget): the
    // drafter sees the block length it was asked for, as in llama.cpp
    k = std::min({k, info_.max_draft, room});
    if (c.budget == 0) k = 0;
    return model_ && k > 0 && k >= c.draft_min ? k : 0;
}

void DraftSources::plan(DraftRequest& r, int32_t room) const {
    r.control->validate();
    for (const auto& src : srcs_) src->check(r);
    if (r.external != nullptr) {
        r.n_external = static_cast<int32_t>(std::min<size_t>(r.external->size(), static_cast<size_t>(room)));
    } else {
        r.block = block(*r.control, room);
    }
}

DraftTimes DraftSources::draft(DraftRound& round) {
    DraftTimes t;
    for (size_t i = 0; i < srcs_.size(); ++i) {
        DraftSource& src = *srcs_[i];
        if (&src == model_) {  // the model pass is a step's drafting time; the n-gram lookups are not
            auto t0 = Clock::now();
            src.prepare(round);
            t.prepare = ms_since(t0);
            t0 = Clock::now();
            src.draft(round);
            t.draft = ms_since(t0);
        } else {
            src.prepare(round);
            src.draft(round);
        }
        for (DraftRequest* r : round.requests()) {
            if (r->open() || r->by >= 0) continue;
            r->by = static_cast<int32_t>(i);
            // the source told about a sequence's next acceptance (an external draft is nobody's)
            if (r->kind != DraftKind::External) last_[static_cast<size_t>(r->seq)] = r->by;
        }
    }
    return t;
}

bool DraftSources::decoded(const std::vector<TargetRows>& rows) {
    bool any = false;
    for (const auto& src : srcs_) any = src->decoded(rows) || any;
    return any;
}

bool DraftSources::kept(const std::vector<TargetRows>& rows) {
    bool any = false;
    for (const auto& src : srcs_) any = src->kept(rows) || any;
    return any;
}

void DraftSources::accept(const DraftRequest& r, int32_t n_accepted) {
    // as llama.cpp's common_speculative_accept: the source of the sequence's last draft
    // is told it made it (0 accepted after a step without one)
    const int32_t mine = r.external != nullptr ? -1 : last_[static_cast<size_t>(r.seq)];
    for (size_t i = 0; i < srcs_.size(); ++i) srcs_[i]->accept(r.seq, n_accepted, static_cast<int32_t>(i) == mine);
}

void DraftSources::commit(const DraftRequest& r, llama_pos n_past) {
    for (const auto& src : srcs_) src->commit(r, n_past);
}

std::vector<int32_t> DraftSources::calibration_rows(int32_t max_rows) const {
    return model_ ? model_->calibration_rows(max_rows) : std::vector<int32_t>{};
}

double DraftSources::timed_pass(int32_t seq, int32_t rows) { return model_ ? model_->timed_pass(seq, rows) : 0.0; }

std::unique_ptr<DraftSource> make_external_source() { return std::make_unique<ExternalSource>(); }

}  // namespace pydflash
