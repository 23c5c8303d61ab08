// The drafter's blocks of one step: greedy, or sampled from q for rejection
// sampling, under the acceptor's grammar mask (acceptor.h verifies them).
#include <algorithm>
#include <cmath>

#include "batch.h"
#include "context_pair.h"
#include "errors.h"
#include "llama-ext.h"

namespace pydflash {

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
            row = acceptor_->constrain(s, logits, *g, plain);
            if (row == nullptr) break;  // the grammar allows nothing more: the block ends
        }
        if (plain && sp.greedy()) {
            t = g ? acceptor_->grammar_argmax(s, logits, *g) : argmax(logits, n_vocab);
            if (t < 0) break;  // the grammar allows nothing more: the block ends
            conf = control.draft_p_min > 0.0f && !head_conf ? draft_confidence(logits, n_vocab, t) : 1.0f;
        } else {
            // q: the drafter's row under the target's transform (and the grammar)
            sampler.distribution(row, win, dist_);
            if (rejection) {
                t = sampler.sample(dist_);
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

}  // namespace pydflash
