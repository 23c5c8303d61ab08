// One speculative step of several sequences in shared passes: one drafter
// pass drafts every block, one target pass verifies them all, then each
// sequence is accepted, rolled back and injected on its own.
#include <algorithm>
#include <chrono>
#include <string>

#include "batch.h"
#include "context_pair.h"
#include "errors.h"

namespace pydflash {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

bool ContextPair::roll_back_target(Work& w, int32_t n_batch) {
    if (w.n_keep >= n_batch) return false;  // everything accepted: nothing to remove
    llama_memory_t mem = llama_get_memory(ctx_tgt_.get());
    const llama_pos n_past = w.s->n_past;
    if (!w.checkpointed) {
        // KV trim; with state planes llama.cpp also selects the plane n_batch - n_keep
        // tokens back, and refuses (false) when that is beyond n_rs_seq
        if (fault_.fire(FaultSite::MemoryRemove) || !llama_memory_seq_rm(mem, w.seq, n_past + w.n_keep, -1)) {
            fail_rollback("llama.cpp refused to remove " + std::to_string(n_batch - w.n_keep) +
                          " rejected tokens from the target's memory (" + rollback_name(rollback_) + ", n_rs_seq " +
                          std::to_string(n_rs_seq_) + ")");
        }
        return false;
    }
    try {
        w.s->checkpoint.restore(ctx_tgt_.get(), w.seq);
    } catch (const RollbackError& e) {
        fail_rollback(e.what());
    }
    // the state is back before the verified batch; drop its K/V: the kept
    // tokens are replayed (their features come from that pass too)
    if (fault_.fire(FaultSite::MemoryRemove) || !llama_memory_seq_rm(mem, w.seq, n_past, -1)) {
        fail_rollback("llama.cpp refused to remove the verified tokens after restoring the checkpoint");
    }
    return true;
}

StepResult ContextPair::step(int32_t seq, const DraftControl& control,
                             const std::optional<std::vector<llama_token>>& external) {
    std::vector<StepResult> rs = step_batch({SeqStep{seq, control, external}});
    if (!rs[0].error.empty()) throw GrammarError(rs[0].error);
    return std::move(rs[0]);
}

std::vector<StepResult> ContextPair::step_batch(const std::vector<SeqStep>& steps) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    if (steps.empty()) return {};
    std::vector<Work> work = plan(steps);
    try {
        return run_step(work);
    } catch (const Interrupted&) {
        // a grammar's work stopped mid-step (a decode's interrupt has reset the pair already)
        clear_memory();
        interrupt_.store(false);
        throw;
    }
}

std::vector<StepResult> ContextPair::run_step(std::vector<Work>& work) {
    StepTimes t;

    auto t0 = Clock::now();
    if (dflash_) {  // features deferred by steps that did not draft, before the drafter reads them
        std::vector<int32_t> drafting;
        for (const Work& w : work) {
            if (w.k_draft > 0 && dflash_->n_deferred(w.seq) > 0) drafting.push_back(w.seq);
        }
        dflash_->flush_deferred(drafting);
        t.inject = ms_since(t0);
    }
    t0 = Clock::now();
    draft_blocks(work);  // one drafter pass over every sequence's block
    t.draft = ms_since(t0);

    t0 = Clock::now();
    save_checkpoints(work);
    t.save = ms_since(t0);

    t0 = Clock::now();
    verify(work);  // [pending, d1..dk] of every sequence in one target pass
    t.verify = ms_since(t0);
    if (mtp_) {  // the head pairs each verified token with the target's hidden state before it
        t0 = Clock::now();
        std::vector<MtpDrafter::Entry> entries;
        for (const Work& w : work) {
            entries.push_back({w.seq, *w.s->pending, w.s->n_past});
            for (size_t i = 0; i < w.draft.size(); ++i) {
                entries.push_back({w.seq, w.draft[i], w.s->n_past + 1 + static_cast<llama_pos>(i)});
            }
        }
        mtp_process(entries);
        t.inject = ms_since(t0);
    }

    // accept per sequence; one whose grammar allows nothing more fails alone
    for (Work& w : work) {
        t0 = Clock::now();
        int32_t n_acc = 0;
        try {
            w.r.tokens = acceptor_->accept(*w.s, w.row, w.draft, w.q, w.req->external.has_value(), n_acc, w.r.logprobs);
            w.n_keep = 1 + n_acc;
            w.r.n_accepted = n_acc;
            if (ngram_ && !w.req->external) ngram_->accept(w.seq, n_acc);
            if (mtp_) mtp_->accept(w.seq, n_acc);  // whoever drafted: the head keeps the last kept row's state
        } catch (const GrammarError& e) {
            // its verified rows are in the caches but not committed: it starts clean
            w.r.error = std::string(e.what()) + "; the context was reset";
            w.n_keep = 0;
        }
        w.r.t_sample_ms = ms_since(t0);
    }
    roll_back_and_inject(work, t);
    return commit(work, t);
}

std::vector<StepResult> ContextPair::step_run(const SeqStep& step, int32_t n_steps, int32_t n_tokens,
                                              bool stop_at_eog) {
    return std::move(step_runs({step}, n_steps, {n_tokens}, stop_at_eog)[0]);
}

std::vector<std::vector<StepResult>> ContextPair::step_runs(const std::vector<SeqStep>& steps, int32_t n_steps,
                                                            const std::vector<int32_t>& n_tokens, bool stop_at_eog) {
    // The caller's work per step is a noticeable share of a plain step of a small
    // target, and what it touches evicts the target's weights from the caches: a
    // run of steps it would take one by one runs here.
    if (n_steps < 1) throw InvalidArgument("n_steps must be at least 1, got " + std::to_string(n_steps));
    if (n_tokens.size() != steps.size()) {
        throw InvalidArgument("n_tokens needs one count per step (" + std::to_string(steps.size()) + "), got " +
                              std::to_string(n_tokens.size()));
    }
    for (int32_t n : n_tokens) {
        if (n < 1) throw InvalidArgument("n_tokens must be at least 1, got " + std::to_string(n));
    }
    std::vector<std::vector<StepResult>> out(steps.size());
    std::vector<int32_t> taken(steps.size(), 0);
    std::vector<bool> live(steps.size(), true);
    for (int32_t i = 0; i < n_steps; ++i) {
        std::vector<SeqStep> batch;
        std::vector<size_t> which;
        for (size_t j = 0; j < steps.size(); ++j) {
            // full: the caller ends it
            if (live[j] && i > 0 && seq_at(steps[j].seq).n_past >= n_ctx_seq()) live[j] = false;
            if (!live[j]) continue;
            SeqStep st = steps[j];
            if (st.control.budget >= 0) st.control.budget = std::max(0, st.control.budget - taken[j]);
            batch.push_back(std::move(st));
            which.push_back(j);
        }
        if (batch.empty()) break;
        std::vector<StepResult> rs = step_batch(batch);
        for (size_t m = 0; m < rs.size(); ++m) {
            const size_t j = which[m];
            out[j].push_back(std::move(rs[m]));
            const StepResult& r = out[j].back();
            taken[j] += static_cast<int32_t>(r.tokens.size());
            const bool eog = stop_at_eog && std::any_of(r.tokens.begin(), r.tokens.end(),
                                                        [this](llama_token t) { return target_->is_eog(t); });
            if (!r.error.empty() || taken[j] >= n_tokens[j] || eog) live[j] = false;
        }
    }
    return out;
}

std::vector<ContextPair::Work> ContextPair::plan(const std::vector<SeqStep>& steps) {
    // every request is checked before any work: a bad one changes nothing
    std::vector<Work> work;
    work.reserve(steps.size());
    std::vector<bool> seen(seqs_.size(), false);
    int32_t n_rows = 0;
    for (const SeqStep& st : steps) {
        Sequence& s = seq_at(st.seq);
        if (seen[static_cast<size_t>(st.seq)]) {
            throw InvalidArgument("sequence " + std::to_string(st.seq) + " appears twice in one step");
        }
        seen[static_cast<size_t>(st.seq)] = true;
        if (!s.pending) {
            throw InvalidArgument("sequence " + std::to_string(st.seq) +
                                  " has nothing to continue from: call prefill() first");
        }
        const int32_t room = n_ctx_seq() - s.n_past - 1;
        if (room < 0) {
            throw ContextLimitError("the context is full (" + std::to_string(n_ctx_seq()) + " tokens)");
        }
        Work w{st.seq, &s, &st, {}, {}, {}};
        if (st.external) {
            st.control.validate();  // an external draft is not bounded by the block
            for (llama_token t : *st.external) target_->check_token(t);
            if (st.external->size() + 1 > static_cast<size_t>(params_.n_batch)) {
                throw InvalidArgument("external draft of " + std::to_string(st.external->size()) +
                                      " tokens exceeds n_batch - 1 = " + std::to_string(params_.n_batch - 1));
            }
            const auto n = std::min<size_t>(st.external->size(), static_cast<size_t>(room));
            w.draft.assign(st.external->begin(), st.external->begin() + static_cast<std::ptrdiff_t>(n));
            w.r.source = "external";
        } else {
            check(st.control);
            int32_t k = st.control.draft_max < 0 ? draft_max_ : st.control.draft_max;
            // the whole block is drafted even when fewer tokens are left (budget): the
            // drafter sees the block length it was asked for, as in llama.cpp
            k = std::min({k, max_draft(), room});
            if (st.control.budget == 0) k = 0;
            if ((drafter_ || mtp_) && k > 0 && k >= st.control.draft_min) w.k_draft = k;
        }
        n_rows += 1 + std::max(w.k_draft, static_cast<int32_t>(w.draft.size()));
        work.push_back(std::move(w));
    }
    if (n_rows > params_.n_batch) {
        throw InvalidArgument("the step's " + std::to_string(n_rows) + " tokens exceed n_batch " +
                              std::to_string(params_.n_batch));
    }
    draft_ngrams(work, n_rows);
    return work;
}

void ContextPair::draft_blocks(std::vector<Work>& work) {
    if (mtp_) return draft_mtp(work);
    if (!dflash_) return;
    std::vector<DFlashDrafter::Request> reqs;
    for (Work& w : work) {
        if (w.k_draft > 0) reqs.push_back({w.seq, w.s, w.k_draft, &w.req->control, &w.draft, &w.q});
    }
    dflash_->draft(reqs, *acceptor_);
    for (Work& w : work) {
        if (w.k_draft == 0) continue;
        // what is kept is cut to the tokens the generation has left (llama.cpp's budget)
        const int32_t budget = w.req->control.budget;
        if (budget >= 0 && static_cast<int32_t>(w.draft.size()) > budget) {
            w.draft.resize(static_cast<size_t>(budget));
            if (w.q.size() > w.draft.size()) w.q.resize(w.draft.size());
        }
        if (!w.draft.empty()) {
            w.r.source = spec_.kind == DrafterKind::DSpark ? "draft-dspark" : "draft-dflash";
            if (ngram_) ngram_->model_drafted(w.seq);
        }
    }
}

void ContextPair::draft_ngrams(std::vector<Work>& work, int32_t n_rows) {
    if (!ngram_) return;
    for (Work& w : work) {
        const DraftControl& c = w.req->control;
        // draft_max bounds the drafter's block only (llama.cpp's --spec-draft-n-max); the
        // budget bounds every source (0: plain decoding)
        if (w.req->external) continue;  // verify what was given
        // as long as the source likes, within the context, the budget and the batch
        const int32_t own = 1 + w.k_draft;
        int32_t cap = std::min(n_ctx_seq() - w.s->n_past - 1, params_.n_batch - (n_rows - own) - 1);
        if (c.budget >= 0) cap = std::min(cap, c.budget);
        std::string source;
        std::vector<llama_token> d = ngram_->draft(w.seq, w.s->history, *w.s->pending, w.s->n_past, cap, source);
        if (d.empty()) continue;
        n_rows += static_cast<int32_t>(d.size()) - w.k_draft;
        w.k_draft = 0;  // the drafter's block is not needed
        w.draft = std::move(d);
        w.r.source = std::move(source);
    }
}

void ContextPair::save_checkpoints(std::vector<Work>& work) {
    // a recurrent state rolls back at most n_rs_seq tokens through its planes;
    // a longer draft (or no planes at all) needs a saved state
    for (Work& w : work) {
        w.checkpointed =
            rollback_ != RollbackKind::KvTrim && static_cast<int32_t>(w.draft.size()) > static_cast<int32_t>(n_rs_seq_);
        if (!w.checkpointed) continue;
        try {
            w.s->checkpoint.save(ctx_tgt_.get(), w.seq);
        } catch (const RollbackError& e) {
            fail_rollback(e.what());
        }
    }
}

void ContextPair::verify(std::vector<Work>& work) {
    llama_batch_ext* b = batch_tgt_.get();
    llama_batch_ext_clear(b);
    int32_t row = 0;
    for (Work& w : work) {
        w.row = row;
        add_token(b, w.seq, *w.s->pending, w.s->n_past, true);
        for (size_t i = 0; i < w.draft.size(); ++i) {
            add_token(b, w.seq, w.draft[i], w.s->n_past + 1 + static_cast<llama_pos>(i), true);
        }
        row += 1 + static_cast<int32_t>(w.draft.size());
    }
    decode_target_batch();
}

void ContextPair::roll_back_and_inject(std::vector<Work>& work, StepTimes& t) {
    // roll back the rejected tails, inject the kept rows (features are per
    // position, so this equals injecting all rows and trimming); checkpointed
    // sequences replay their kept tokens in one more target pass, injected after it
    auto t0 = Clock::now();
    // a sequence that drafted with the drafter this step is injected now (it will likely
    // draft again); the others defer (injection.cpp)
    std::vector<Span> spans, later;
    std::vector<Work*> replay;
    for (Work& w : work) {
        if (!w.r.error.empty()) continue;
        const auto n_batch = 1 + static_cast<int32_t>(w.draft.size());
        if (roll_back_target(w, n_batch)) {
            replay.push_back(&w);
        } else {
            (w.k_draft > 0 ? spans : later).push_back({w.seq, w.row, w.n_keep, w.s->n_past});
        }
    }
    t.rollback = ms_since(t0);
    if (dflash_ && !(spans.empty() && later.empty())) {
        t0 = Clock::now();
        if (!spans.empty()) dflash_->inject(spans);
        if (!later.empty()) dflash_->defer(later);
        t.inject += ms_since(t0);
    }
    if (replay.empty()) return;
    t0 = Clock::now();
    llama_batch_ext* b = batch_tgt_.get();
    llama_batch_ext_clear(b);
    spans.clear();
    later.clear();
    int32_t row = 0;
    for (Work* w : replay) {
        add_token(b, w->seq, *w->s->pending, w->s->n_past, false);
        for (int32_t i = 0; i + 1 < w->n_keep; ++i) {
            add_token(b, w->seq, w->draft[static_cast<size_t>(i)], w->s->n_past + 1 + i, false);
        }
        (w->k_draft > 0 ? spans : later).push_back({w->seq, row, w->n_keep, w->s->n_past});
        row += w->n_keep;
    }
    decode_target_batch();
    t.rollback += ms_since(t0);
    if (dflash_) {
        t0 = Clock::now();
        if (!spans.empty()) dflash_->inject(spans);
        if (!later.empty()) dflash_->defer(later);
        t.inject += ms_since(t0);
    }
}

std::vector<StepResult> ContextPair::commit(std::vector<Work>& work, const StepTimes& t) {
    std::vector<StepResult> out;
    out.reserve(work.size());
    for (Work& w : work) {
        StepResult& r = w.r;
        r.seq = w.seq;
        r.n_batch_seqs = static_cast<int32_t>(work.size());
        r.t_draft_ms = w.k_draft > 0 ? t.draft : 0.0;
        r.t_verify_ms = t.verify;
        r.t_inject_ms = t.inject;
        r.t_rollback_ms = (w.checkpointed ? t.save : 0.0) + t.rollback;
        r.n_drafted = static_cast<int32_t>(w.draft.size());
        r.draft_max = w.req->external ? r.n_drafted : w.k_draft;
        if (!r.error.empty()) {
            clear_sequence(w.seq);
        } else {
            Sequence& s = *w.s;
            const int32_t new_past = s.n_past + w.n_keep;
            // nothing of a step without a drafter pass lies past new_past in the drafter's cache
            // (its rows were deferred or injected below it); seq_rm scans every cell: not per plain step
            if (dflash_ && w.k_draft > 0) dflash_->remove(w.seq, new_past);
            if (mtp_) mtp_->remove(w.seq, new_past);
            s.history.push_back(*s.pending);
            s.history.insert(s.history.end(), w.draft.begin(), w.draft.begin() + (w.n_keep - 1));
            s.n_past = new_past;
            s.pending = r.tokens.back();
            r.n_past = s.n_past;
        }
        r.drafted = std::move(w.draft);
        out.push_back(std::move(r));
    }
    return out;
}

}  // namespace pydflash
