// The acceptance rules of one step (acceptor.h).
#include "acceptor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "errors.h"

namespace pydflash {

Acceptor::Acceptor(llama_context* target, int32_t n_vocab, DecodeFailure& fail)
    : ctx_tgt_(target), n_vocab_(n_vocab), fail_(fail) {}

void Acceptor::note_logprob(const Sequence& s, const float* raw, llama_token t, bool have_dist,
                            std::vector<TokenLogprob>& out) const {
    const SamplingParams& sp = s.sampler->params();
    if (!sp.logprobs) return;
    if (!sp.post_sampling_probs) {
        out.push_back(raw_logprob(raw, n_vocab_, t, sp.top_logprobs));
    } else if (have_dist) {
        out.push_back(distribution_logprob(dist_, t, sp.top_logprobs));
    } else {  // a greedy chain: p is one-hot at the token
        Distribution chosen;
        chosen.ids.assign(1, t);
        chosen.probs.assign(1, 1.0f);
        out.push_back(distribution_logprob(chosen, t, sp.top_logprobs));
    }
}

llama_token Acceptor::grammar_argmax(const Sequence& s, const float* raw, Grammar& grammar) {
    const int32_t n_vocab = n_vocab_;
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

const float* Acceptor::constrain(const Sequence& s, const float* raw, Grammar& grammar, bool plain) {
    const int32_t n_vocab = n_vocab_;
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

std::vector<llama_token> Acceptor::accept(Sequence& s, int32_t row0, const std::vector<llama_token>& draft,
                                          const std::vector<Distribution>& q, bool external, int32_t& n_acc,
                                          std::vector<TokenLogprob>& logprobs) {
    Sampler& sampler = *s.sampler;
    Grammar* grammar = s.grammar.get();
    const SamplingParams& sp = sampler.params();
    const auto k = static_cast<int32_t>(draft.size());
    const int32_t n_vocab = n_vocab_;
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
        const float* raw = llama_get_logits_ith(ctx_tgt_, row0 + i);
        if (raw == nullptr) fail_.fail_decode("reading target logits", -1);
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
