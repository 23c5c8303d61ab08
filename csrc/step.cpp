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
    const llama_pos n_past = w.d.s->n_past;
    const int32_t seq = w.d.seq;
    if (!w.checkpointed) {
        // KV trim; with state planes llama.cpp also selects the plane n_batch - n_keep
        // tokens back, and refuses (false) when that is beyond n_rs_seq
        if (fault_.fire(FaultSite::MemoryRemove) || !llama_memory_seq_rm(mem, seq, n_past + w.n_keep, -1)) {
            fail_rollback("llama.cpp refused to remove " + std::to_string(n_batch - w.n_keep) +
                          " rejected tokens from the target's memory (" + rollback_name(info_.rollback) +
                          ", n_rs_seq " + std::to_string(info_.n_rs_seq) + ")");
        }
        return false;
    }
    try {
        w.d.s->checkpoint.restore(ctx_tgt_.get(), seq);
    } catch (const RollbackError& e) {
        fail_rollback(e.what());
    }
    // the state is back before the verified batch; drop its K/V: the kept
    // tokens are replayed (their features come from that pass too)
    if (fault_.fire(FaultSite::MemoryRemove) || !llama_memory_seq_rm(mem, seq, n_past, -1)) {
        fail_rollback("llama.cpp refused to remove the verified tokens after restoring the checkpoint");
    }
    return true;
}

StepResult step(ContextPair& pair, int32_t seq, const DraftControl& control,
                const std::optional<std::vector<llama_token>>& external) {
    std::vector<StepResult> rs = pair.step_batch({SeqStep{seq, control, external}});
    if (!rs[0].error.empty()) throw GrammarError(rs[0].error);
    return std::move(rs[0]);
}

namespace {

// The rows of the pending token of `d` and its first n - 1 drafted tokens, from row0 of a target pass.
TargetRows rows_of(const DraftRequest& d, int32_t row0, int32_t n) {
    return {d.seq, row0, n, d.s->n_past, *d.s->pending, d.draft.data(), d.block == 0};
}

}  // namespace

std::vector<StepResult> ContextPair::step_batch(const std::vector<SeqStep>& steps) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    if (steps.empty()) return {};
    int32_t n_rows = 0;
    std::vector<Work> work = plan(steps, n_rows);
    try {
        return run_step(work, n_rows);
    } catch (const Interrupted&) {
        // a grammar's work stopped mid-step (a decode's interrupt has reset the pair already)
        clear_memory();
        interrupt_.store(false);
        throw;
    }
}

std::vector<StepResult> ContextPair::run_step(std::vector<Work>& work, int32_t n_rows) {
    StepTimes t;

    // each sequence's draft from its first source that has one; the model
    // drafter's blocks in one pass
    std::vector<DraftRequest*> reqs;
    reqs.reserve(work.size());
    for (Work& w : work) reqs.push_back(&w.d);
    DraftRound round(std::move(reqs), n_rows, info_.params.n_batch, n_ctx_seq());
    const DraftTimes dt = sources_->draft(round);
    t.inject = dt.prepare;  // features deferred by steps that did not draft, before the drafter reads them
    t.draft = dt.draft;

    auto t0 = Clock::now();
    save_checkpoints(work);
    t.save = ms_since(t0);

    t0 = Clock::now();
    verify(work);  // [pending, d1..dk] of every sequence in one target pass
    t.verify = ms_since(t0);
    t0 = Clock::now();
    std::vector<TargetRows> rows;
    rows.reserve(work.size());
    for (const Work& w : work) rows.push_back(rows_of(w.d, w.row, 1 + static_cast<int32_t>(w.d.draft.size())));
    if (sources_->decoded(rows)) t.inject += ms_since(t0);  // the MTP head's pairs of tokens and states

    // accept per sequence; one whose grammar allows nothing more fails alone
    for (Work& w : work) {
        t0 = Clock::now();
        int32_t n_acc = 0;
        try {
            w.r.tokens =
                acceptor_->accept(*w.d.s, w.row, w.d.draft, w.d.q, w.req->external.has_value(), n_acc, w.r.logprobs);
            w.n_keep = 1 + n_acc;
            w.r.n_accepted = n_acc;
            sources_->accept(w.d, n_acc);
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

std::vector<StepResult> step_run(ContextPair& pair, const SeqStep& step, int32_t n_steps, int32_t n_tokens,
                                 bool stop_at_eog) {
    return std::move(pair.step_runs({step}, n_steps, {n_tokens}, stop_at_eog)[0]);
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

std::vector<ContextPair::Work> ContextPair::plan(const std::vector<SeqStep>& steps, int32_t& n_rows) {
    // every request is checked before any work: a bad one changes nothing
    std::vector<Work> work;
    work.reserve(steps.size());
    std::vector<bool> seen(seqs_.size(), false);
    n_rows = 0;
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
        Work w;
        w.req = &st;
        w.d.seq = st.seq;
        w.d.s = &s;
        w.d.control = &st.control;
        w.d.external = st.external ? &*st.external : nullptr;
        sources_->plan(w.d, room);  // the caller's draft, or the model's block
        n_rows += w.d.rows();
        work.push_back(std::move(w));
    }
    if (n_rows > info_.params.n_batch) {
        throw InvalidArgument("the step's " + std::to_string(n_rows) + " tokens exceed n_batch " +
                              std::to_string(info_.params.n_batch));
    }
    return work;
}

void ContextPair::save_checkpoints(std::vector<Work>& work) {
    // a recurrent state rolls back at most n_rs_seq tokens through its planes;
    // a longer draft (or no planes at all) needs a saved state
    for (Work& w : work) {
        w.checkpointed = info_.rollback != RollbackKind::KvTrim &&
                         static_cast<int32_t>(w.d.draft.size()) > static_cast<int32_t>(info_.n_rs_seq);
        if (!w.checkpointed) continue;
        try {
            w.d.s->checkpoint.save(ctx_tgt_.get(), w.d.seq);
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
        const DraftRequest& d = w.d;
        w.row = row;
        add_token(b, d.seq, *d.s->pending, d.s->n_past, true);
        for (size_t i = 0; i < d.draft.size(); ++i) {
            add_token(b, d.seq, d.draft[i], d.s->n_past + 1 + static_cast<llama_pos>(i), true);
        }
        row += 1 + static_cast<int32_t>(d.draft.size());
    }
    decode_target_batch();
}

void ContextPair::roll_back_and_inject(std::vector<Work>& work, StepTimes& t) {
    // roll back the rejected tails, then tell the sources which rows stay (a drafter
    // injects their features: they are per position, so this equals injecting all rows
    // and trimming); checkpointed sequences replay their kept tokens in one more target
    // pass, whose rows are the ones kept
    auto t0 = Clock::now();
    std::vector<TargetRows> kept;
    std::vector<Work*> replay;
    for (Work& w : work) {
        if (!w.r.error.empty()) continue;
        const auto n_batch = 1 + static_cast<int32_t>(w.d.draft.size());
        if (roll_back_target(w, n_batch)) {
            replay.push_back(&w);
        } else {
            kept.push_back(rows_of(w.d, w.row, w.n_keep));
        }
    }
    t.rollback = ms_since(t0);
    t0 = Clock::now();
    if (sources_->kept(kept)) t.inject += ms_since(t0);
    if (replay.empty()) return;
    t0 = Clock::now();
    llama_batch_ext* b = batch_tgt_.get();
    llama_batch_ext_clear(b);
    kept.clear();
    int32_t row = 0;
    for (Work* w : replay) {
        const DraftRequest& d = w->d;
        add_token(b, d.seq, *d.s->pending, d.s->n_past, false);
        for (int32_t i = 0; i + 1 < w->n_keep; ++i) {
            add_token(b, d.seq, d.draft[static_cast<size_t>(i)], d.s->n_past + 1 + i, false);
        }
        kept.push_back(rows_of(d, row, w->n_keep));
        row += w->n_keep;
    }
    decode_target_batch();
    t.rollback += ms_since(t0);
    t0 = Clock::now();
    if (sources_->kept(kept)) t.inject += ms_since(t0);
}

std::vector<StepResult> ContextPair::commit(std::vector<Work>& work, const StepTimes& t) {
    std::vector<StepResult> out;
    out.reserve(work.size());
    for (Work& w : work) {
        StepResult& r = w.r;
        DraftRequest& d = w.d;
        r.seq = d.seq;
        r.kind = d.kind;
        r.n_batch_seqs = static_cast<int32_t>(work.size());
        r.t_draft_ms = d.block > 0 ? t.draft : 0.0;
        r.t_verify_ms = t.verify;
        r.t_inject_ms = t.inject;
        r.t_rollback_ms = (w.checkpointed ? t.save : 0.0) + t.rollback;
        r.n_drafted = static_cast<int32_t>(d.draft.size());
        r.draft_max = w.req->external ? r.n_drafted : d.block;
        if (!r.error.empty()) {
            clear_sequence(d.seq);
        } else {
            Sequence& s = *d.s;
            const int32_t new_past = s.n_past + w.n_keep;
            sources_->commit(d, new_past);
            s.history.push_back(*s.pending);
            s.history.insert(s.history.end(), d.draft.begin(), d.draft.begin() + (w.n_keep - 1));
            s.n_past = new_past;
            s.pending = r.tokens.back();
            r.n_past = s.n_past;
        }
        r.drafted = std::move(d.draft);
        out.push_back(std::move(r));
    }
    return out;
}

}  // namespace pydflash
