// The drafting and acceptance rules of one step: the drafter's block (greedy,
// or sampled from q for rejection sampling) and its verification against the
// target's rows (longest agreeing prefix, llama.cpp's match rule, or
// speculative sampling with residual resampling).
#include <algorithm>
#include <cmath>
#include <limits>

#include "batch.h"
#include "context_pair.h"
#include "errors.h"
#include "llama-ext.h"

namespace pydflash {

std::vector<llama_token> ContextPair::recent_tokens(const Sequence& s) const {
    const SamplingParams& sp = s.sampler->params();
    if (!sp.has_penalties() || sp.penalty_last_n == 0) return {};
    // the last penalty_last_n tokens of history + pending, without copying the whole history
    const size_t n_hist = std::min(s.history.size(), static_cast<size_t>(sp.penalty_last_n) - 1);
    std::vector<llama_token> out(s.history.end() - static_cast<std::ptrdiff_t>(n_hist), s.history.end());
    out.push_back(*s.pending);
    return out;
}

namespace {

void push_recent(std::vector<llama_token>& win, llama_token t, int32_t last_n) {
    if (last_n <= 0) return;
    win.push_back(t);
    if (win.size() > static_cast<size_t>(last_n)) win.erase(win.begin());
}

}  // namespace

void ContextPair::draft_blocks(std::vector<Work>& work) {
    if (mtp_) return draft_mtp(work);
    if (!drafter_) return;
    // As in llama.cpp, the drafter fills the pair's draft length (a drafter is trained on
    // whole blocks; attention inside the block is two-way, so a shorter block drafts
    // other tokens) and a step asking for fewer reads the first rows only. DFlash2 /
    // DSpark graphs also slice a pass into equal blocks: all take the longest.
    auto block_len = [&](const Work& w) {
        return std::max(w.k_draft, std::min(draft_max_, n_ctx_seq() - w.s->n_past - 1));
    };
    int32_t pass_len = 0;
    for (const Work& w : work) {
        if (w.k_draft > 0) pass_len = std::max(pass_len, block_len(w));
    }
    const int32_t lead = spec_.lead_rows();
    // every row outputs: the dflash graph does not select output rows, so a row
    // without output would shift the logits of the rows after it; the DFlash2
    // lattice is read from the unmasked nextn rows instead (llama.cpp outputs none)
    const bool out = spec_.kind != DrafterKind::DFlash2;
    llama_batch_ext* b = batch_dft_.get();
    llama_batch_ext_clear(b);
    int32_t row = 0;
    for (Work& w : work) {
        if (w.k_draft == 0) continue;
        const int32_t n_tok = lead + (spec_.equal_blocks() ? pass_len : block_len(w));
        const llama_pos p0 = w.s->n_past;
        w.row_draft = row;
        add_token(b, w.seq, *w.s->pending, p0, out);
        for (int32_t i = 1; i < n_tok; ++i) add_token(b, w.seq, spec_.mask_token, p0 + i, out);
        row += n_tok;
    }
    if (row == 0) return;
    const int32_t rc =
        fault_.fire(FaultSite::DrafterDecode) ? -1 : llama_process(ctx_dft_.get(), LLAMA_PROCESS_TYPE_DECODE, b);
    if (rc != 0) fail_decode("drafter block decode", rc);
    for (Work& w : work) {
        if (w.k_draft == 0) continue;
        if (spec_.kind == DrafterKind::DFlash2) {
            w.draft = read_lattice(*w.s, w.row_draft, w.k_draft, w.req->control);  // q stays empty: one-hot
        } else {
            w.draft = read_block(*w.s, w.row_draft + lead, w.k_draft, w.req->control, w.q);
        }
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
        // the block's K/V are noise: the drafter cache must hold only injected features
        llama_memory_seq_rm(llama_get_memory(ctx_dft_.get()), w.seq, w.s->n_past, -1);
    }
}

const float* ContextPair::nextn_row(int32_t row) {
    const float* r = llama_get_embeddings_nextn_ith(ctx_dft_.get(), row);
    if (r == nullptr) fail_decode("reading the drafter's nextn output", -1);
    return r;
}

std::vector<llama_token> ContextPair::read_lattice(Sequence& s, int32_t row0, int32_t n, const DraftControl& control) {
    // DFlash2: row i of the block holds [k candidate ids | k x k scores (predecessor-major)];
    // the walk is llama.cpp's greedy one: from candidate 0, the best successor of the
    // current predecessor; the draft is a deterministic function of the context
    const int32_t k = spec_.selector_top_k;
    Grammar* g = nullptr;
    if (s.grammar) {
        if (!s.draft_grammar) s.draft_grammar = s.grammar->clone();
        s.draft_grammar->assign_state(*s.grammar);
        g = s.draft_grammar.get();
    }
    std::vector<llama_token> out;
    int32_t pred = 0;
    for (int32_t i = 1; i <= n; ++i) {
        const float* r = nextn_row(row0 + i);
        const float* scores = r + k + static_cast<ptrdiff_t>(pred) * k;
        pred = static_cast<int32_t>(std::max_element(scores, scores + k) - scores);
        if (control.draft_p_min > 0.0f) {
            float sum = 0.0f;  // softmax of the k scores at the argmax
            for (int32_t j = 0; j < k; ++j) sum += std::exp(scores[j] - scores[pred]);
            if (1.0f / sum < control.draft_p_min) break;
        }
        const auto t = static_cast<llama_token>(r[pred]);
        if (t < 0 || t >= target_->n_vocab()) break;  // never for a lattice the graph wrote
        if (g) {
            try {
                g->accept(t);
            } catch (const GrammarError&) {
                break;  // the target could not emit it: the block ends here
            }
        }
        out.push_back(t);
    }
    if (static_cast<int32_t>(out.size()) < control.draft_min) out.clear();
    return out;
}

std::vector<llama_token> ContextPair::read_block(Sequence& s, int32_t row0, int32_t n, const DraftControl& control,
                                                 std::vector<Distribution>& q) {
    Sampler& sampler = *s.sampler;
    const SamplingParams& sp = sampler.params();
    const bool rejection = !sp.greedy() && sp.verify == VerifyMode::Rejection;
    const bool coupled = !sp.greedy() && sp.verify == VerifyMode::Coupled;
    const int32_t n_vocab = target_->n_vocab();
    const bool plain = !sp.has_penalties() && sp.logit_bias.empty();
    // DSpark cuts on its confidence head instead of the drafter's top probability
    const bool head_conf = spec_.kind == DrafterKind::DSpark && control.draft_p_min > 0.0f;
    std::vector<llama_token> out;
    std::vector<llama_token> win = plain ? std::vector<llama_token>() : recent_tokens(s);
    // under a grammar the block follows it too (a copy of its state walks the
    // block), so drafts are not wasted on tokens the target cannot emit
    Grammar* g = nullptr;
    if (s.grammar) {
        if (!s.draft_grammar) s.draft_grammar = s.grammar->clone();
        s.draft_grammar->assign_state(*s.grammar);
        g = s.draft_grammar.get();
    }
    for (int32_t i = 0; i < n; ++i) {
        if (head_conf && nextn_row(row0 + i)[0] < control.draft_p_min) break;
        const float* logits = llama_get_logits_ith(ctx_dft_.get(), row0 + i);
        if (logits == nullptr) fail_decode("reading drafter logits", -1);
        llama_token t;
        float conf;
        const float* row = logits;
        if (g && !(plain && sp.greedy())) {
            row = constrain(s, logits, *g, plain);
            if (row == nullptr) break;  // the grammar allows nothing more: the block ends
        }
        if (plain && sp.greedy()) {
            t = g ? grammar_argmax(s, logits, *g) : argmax(logits, n_vocab);
            if (t < 0) break;  // the grammar allows nothing more: the block ends
            conf = control.draft_p_min > 0.0f && !head_conf ? draft_confidence(logits, n_vocab, t) : 1.0f;
        } else {
            // q: the drafter's row under the target's transform (and the grammar)
            sampler.distribution(row, win, dist_);
            if (rejection) {
                t = sampler.sample(dist_);
                conf = dist_.prob_of(t);
            } else if (coupled) {  // coupled hook: q's Gumbel-max under the target's noise at this position
                t = sampler.draw(dist_, s.n_past + 1 + i);
                conf = dist_.prob_of(t);
            } else {
                t = dist_.ids[0];  // the transformed argmax: greedy drafts
                conf = sp.greedy() ? (control.draft_p_min > 0.0f ? draft_confidence(logits, n_vocab, t) : 1.0f)
                                   : dist_.probs[0];
            }
            if (head_conf) conf = 1.0f;
        }
        if (conf < control.draft_p_min) break;
        if (g) {
            try {
                g->accept(t);
            } catch (const GrammarError&) {
                break;  // a block that cannot continue under the grammar ends here
            }
        }
        if (rejection) q.push_back(dist_);
        out.push_back(t);
        push_recent(win, t, sp.penalty_last_n);
    }
    if (static_cast<int32_t>(out.size()) < control.draft_min) {
        out.clear();
        q.clear();
    }
    return out;
}

void ContextPair::note_logprob(const Sequence& s, const float* raw, llama_token t, bool have_dist,
                               std::vector<TokenLogprob>& out) const {
    const SamplingParams& sp = s.sampler->params();
    if (!sp.logprobs) return;
    if (!sp.post_sampling_probs) {
        out.push_back(raw_logprob(raw, target_->n_vocab(), t, sp.top_logprobs));
    } else if (have_dist) {
        out.push_back(distribution_logprob(dist_, t, sp.top_logprobs));
    } else {  // a greedy chain: p is one-hot at the token
        Distribution chosen;
        chosen.ids.assign(1, t);
        chosen.probs.assign(1, 1.0f);
        out.push_back(distribution_logprob(chosen, t, sp.top_logprobs));
    }
}

llama_token ContextPair::grammar_argmax(const Sequence& s, const float* raw, Grammar& grammar) {
    const int32_t n_vocab = target_->n_vocab();
    // a state seen before: the best of its allowed tokens (structural positions of a
    // JSON grammar allow a handful)
    if (const std::vector<llama_token>* known = grammar.known_allowed()) {
        llama_token best = -1;
        for (llama_token t : *known) {
            if (best < 0 || raw[t] > raw[best]) best = t;  // ascending ids: ties keep the lower
        }
        return best;
    }
    // the model's own choice, when the grammar allows it (free text, strings)
    const llama_token top = argmax(raw, n_vocab);
    if (grammar.allows_one(top)) return top;
    const float* row = constrain(s, raw, grammar, true);
    return row == nullptr ? -1 : argmax(row, n_vocab);
}

const float* ContextPair::constrain(const Sequence& s, const float* raw, Grammar& grammar, bool plain) {
    const int32_t n_vocab = target_->n_vocab();
    const SamplingParams& sp = s.sampler->params();
    // How many of the best allowed tokens the chain can use: greedy takes one, top-k
    // k, unless the chain reorders the row first (penalties, bias) or looks at all of
    // it (top-n-sigma, no top-k). Those are found by trying tokens in logit order one
    // at a time, far cheaper than the whole vocabulary when the grammar allows what
    // the model prefers; the row keeps only them, which is what the chain would keep.
    const int32_t need = !plain || sp.top_n_sigma > 0.0f ? 0 : sp.greedy() ? 1 : sp.top_k;
    if (need > 0 && need <= n_vocab) {
        const auto n_scan = static_cast<size_t>(std::min(n_vocab, std::max(64, 4 * need)));
        order_.resize(static_cast<size_t>(n_vocab));
        for (int32_t i = 0; i < n_vocab; ++i) order_[static_cast<size_t>(i)] = {raw[i], i};
        std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(n_scan), order_.end(),
                          [](const auto& a, const auto& b) {
                              return a.first > b.first || (a.first == b.first && a.second < b.second);
                          });
        std::vector<llama_token> best;
        for (size_t i = 0; i < n_scan && std::isfinite(order_[i].first); ++i) best.push_back(order_[i].second);
        std::vector<bool> ok;
        if (const std::vector<llama_token>* known = grammar.known_allowed()) {
            for (llama_token t : best) ok.push_back(std::binary_search(known->begin(), known->end(), t));
        } else {
            ok = grammar.allows_each(best);
        }
        std::vector<llama_token> found;
        for (size_t i = 0; i < best.size() && found.size() < static_cast<size_t>(need); ++i) {
            if (ok[i]) found.push_back(best[i]);
        }
        if (found.size() == static_cast<size_t>(need)) {
            masked_.assign(static_cast<size_t>(n_vocab), -std::numeric_limits<float>::infinity());
            for (llama_token t : found) masked_[static_cast<size_t>(t)] = raw[t];
            return masked_.data();
        }
    }
    masked_.assign(raw, raw + n_vocab);
    grammar.mask(masked_.data(), n_vocab);
    if (!std::isfinite(masked_[static_cast<size_t>(argmax(masked_.data(), n_vocab))])) return nullptr;
    return masked_.data();
}

std::vector<llama_token> ContextPair::accept(Sequence& s, int32_t row0, const std::vector<llama_token>& draft,
                                             const std::vector<Distribution>& q, bool external, int32_t& n_acc,
                                             std::vector<TokenLogprob>& logprobs) {
    Sampler& sampler = *s.sampler;
    Grammar* grammar = s.grammar.get();
    const SamplingParams& sp = sampler.params();
    const auto k = static_cast<int32_t>(draft.size());
    const int32_t n_vocab = target_->n_vocab();
    const bool plain = !sp.has_penalties() && sp.logit_bias.empty();
    const bool rejection = !sp.greedy() && sp.verify == VerifyMode::Rejection;
    std::vector<llama_token> win = plain ? std::vector<llama_token>() : recent_tokens(s);
    std::vector<llama_token> out;
    n_acc = 0;
    Distribution one_hot;
    // a token leaves row i: its logprob (from the raw row, or p_i = dist_ when
    // computed), and the grammar moves past it before row i + 1 is masked
    auto emit = [&](llama_token t, const float* raw, bool have_dist) {
        out.push_back(t);
        note_logprob(s, raw, t, have_dist, logprobs);
        if (grammar) grammar->accept(t);
    };
    for (int32_t i = 0; i <= k; ++i) {
        const float* raw = llama_get_logits_ith(ctx_tgt_.get(), row0 + i);
        if (raw == nullptr) fail_decode("reading target logits", -1);
        // under a grammar: the chain on the masked row (llama.cpp's grammar-first order)
        const float* row = raw;
        if (grammar && !(plain && sp.greedy())) {
            row = constrain(s, raw, *grammar, plain);
            if (row == nullptr) throw GrammarError("the grammar allows no token here");
        }
        if (plain && sp.greedy()) {
            const llama_token t = grammar ? grammar_argmax(s, raw, *grammar) : argmax(raw, n_vocab);
            if (t < 0) throw GrammarError("the grammar allows no token here");
            emit(t, raw, false);
            if (i == k || t != draft[static_cast<size_t>(i)]) break;
            ++n_acc;
            continue;
        }
        sampler.distribution(row, win, dist_);  // p_i
        // row i's token sits at absolute position n_past + 1 + i: the coupled noise's key
        const llama_pos pos = s.n_past + 1 + i;
        if (i == k) {  // every draft accepted: one more token of the target's own
            emit(sampler.draw(dist_, pos), raw, true);
            break;
        }
        const llama_token x = draft[static_cast<size_t>(i)];
        if (!rejection) {  // match, coupled: the target's own token must equal the draft
            const llama_token t = sampler.draw(dist_, pos);
            emit(t, raw, true);
            if (t != x) break;
        } else {
            // speculative sampling: accept x with probability min(1, p(x)/q(x)),
            // else draw from the residual max(0, p - q); exact for the target's p
            const Distribution* qi = &one_hot;
            if (!external && static_cast<size_t>(i) < q.size()) {
                qi = &q[static_cast<size_t>(i)];
            } else {  // an external draft is deterministic: q is one-hot at x
                one_hot.ids.assign(1, x);
                one_hot.probs.assign(1, 1.0f);
            }
            const double px = dist_.prob_of(x);
            const double qx = qi->prob_of(x);
            if (qx > 0.0 && sampler.uniform() < std::min(1.0, px / qx)) {
                emit(x, raw, true);
            } else {
                // the residual's sample follows p overall: its logprob is p's
                emit(sampler.sample_residual(dist_, *qi), raw, true);
                break;
            }
        }
        ++n_acc;
        push_recent(win, x, sp.penalty_last_n);
    }
    return out;
}

}  // namespace pydflash
