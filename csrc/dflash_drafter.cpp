// The DFlash drafter's context and its blocks (dflash_drafter.h): greedy, or
// sampled from q for rejection sampling, under the acceptor's grammar mask.
#include "dflash_drafter.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "backend.h"
#include "batch.h"
#include "errors.h"
#include "llama-ext.h"

namespace pydflash {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

DFlashDrafter::DFlashDrafter(std::shared_ptr<Model> drafter, const DraftSpec& spec, const PairParams& params,
                             Window window, int32_t draft_max, llama_context* target, DecodeFailure& fail,
                             FaultPlan& fault)
    : model_(std::move(drafter)),
      spec_(spec),
      params_(params),
      draft_max_(draft_max),
      window_(window.ring),
      view_(window.view),
      target_(target),
      n_vocab_(llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(target)))),
      fail_(fail),
      fault_(fault) {
    // features of these target layers are read after every target decode;
    // must be on before the first decode (it forces a scheduler reserve)
    for (int32_t lid : spec_.target_layer_ids) {
        llama_set_embeddings_layer_inp(target_, static_cast<uint32_t>(lid), true);
    }
    llama_context_params dp = context_params(params_, true);
    dp.ctx_other = target_;  // the drafter borrows the target's embeddings and head
    // a drafter with its own sliding window gets a window-sized SWA cache (llama.cpp's
    // default, swa_full, sizes it for the whole context); the pair's ring sizes the rest
    dp.swa_full = false;
    dp.n_ctx = drafter_n_ctx(dp.n_ctx);
    // DFlash2 / DSpark blocks of one pass are padded to one length (drafter.h): a
    // padded block may reach past its sequence's share of the cache
    if (spec_.equal_blocks()) dp.n_ctx += static_cast<uint32_t>(params_.n_seq * spec_.block_size);
    ctx_.reset(llama_init_from_model(model_->get(), dp));
    if (!ctx_) {
        throw ModelLoadError(model_->path() + ": failed to create the drafter context: " + take_thread_errors());
    }
    llama_set_causal_attn(ctx_.get(), spec_.causal);
    // the DFlash2 lattice (every row: unmasked) and the DSpark confidence (output rows)
    // come back as nextn embeddings, as common/speculative.cpp sets them
    if (spec_.kind != DrafterKind::DFlash) {
        llama_set_embeddings_nextn(ctx_.get(), true, spec_.kind != DrafterKind::DFlash2);
    }
    batch_.reset(llama_batch_ext_init(ctx_.get()));
    max_deferred_ = max_deferred();
    if (!batch_) throw Error("llama_batch_ext_init failed for the drafter");
    deferred_.resize(static_cast<size_t>(params_.n_seq));
}

DFlashDrafter::~DFlashDrafter() = default;

void DFlashDrafter::draft(const std::vector<Request>& reqs, Acceptor& rules) {
    // As in llama.cpp, the drafter fills the pair's draft length (a drafter is trained on
    // whole blocks; attention inside the block is two-way, so a shorter block drafts
    // other tokens) and a step asking for fewer reads the first rows only. DFlash2 /
    // DSpark graphs also slice a pass into equal blocks: all take the longest.
    auto block_len = [&](const Request& r) {
        return std::max(r.n, std::min(draft_max_, n_ctx_seq() - r.s->n_past - 1));
    };
    int32_t pass_len = 0;
    for (const Request& r : reqs) pass_len = std::max(pass_len, block_len(r));
    const int32_t lead = spec_.lead_rows();
    // every row outputs: the dflash graph does not select output rows, so a row
    // without output would shift the logits of the rows after it; the DFlash2
    // lattice is read from the unmasked nextn rows instead (llama.cpp outputs none)
    const bool out = spec_.kind != DrafterKind::DFlash2;
    llama_batch_ext* b = batch_.get();
    llama_batch_ext_clear(b);
    int32_t row = 0;
    std::vector<int32_t> row_draft;  // per request: the first row of its block in the pass
    for (const Request& r : reqs) {
        const int32_t n_tok = lead + (spec_.equal_blocks() ? pass_len : block_len(r));
        const llama_pos p0 = r.s->n_past;
        row_draft.push_back(row);
        add_token(b, r.seq, *r.s->pending, p0, out);
        for (int32_t i = 1; i < n_tok; ++i) add_token(b, r.seq, spec_.mask_token, p0 + i, out);
        row += n_tok;
    }
    if (row == 0) return;
    const int32_t rc =
        fault_.fire(FaultSite::DrafterDecode) ? -1 : llama_process(ctx_.get(), LLAMA_PROCESS_TYPE_DECODE, b);
    if (rc != 0) fail_.fail_decode("drafter block decode", rc);
    for (size_t j = 0; j < reqs.size(); ++j) {
        const Request& r = reqs[j];
        if (spec_.kind == DrafterKind::DFlash2) {
            *r.out = read_lattice(*r.s, row_draft[j], r.n, *r.control);  // q stays empty: one-hot
        } else {
            *r.out = read_block(*r.s, row_draft[j] + lead, r.n, *r.control, *r.q, rules);
        }
        // the block's K/V are noise: the drafter cache must hold only injected features
        remove(r.seq, r.s->n_past);
    }
}

double DFlashDrafter::timed_pass(int32_t seq, int32_t rows) {
    // as draft() builds them: DFlash2 reads its nextn rows, not logits
    const bool out = spec_.kind != DrafterKind::DFlash2;
    const llama_token tok = 0;  // any valid id: the cost does not depend on it
    llama_batch_ext* b = batch_.get();
    llama_batch_ext_clear(b);
    add_token(b, seq, tok, 0, out);
    for (int32_t i = 1; i < rows; ++i) add_token(b, seq, spec_.mask_token, i, out);
    const auto t0 = Clock::now();
    const int32_t rc = llama_process(ctx_.get(), LLAMA_PROCESS_TYPE_DECODE, b);
    const double ms = ms_since(t0);
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), seq, -1, -1);
    if (rc != 0) fail_.fail_decode("drafter calibration pass", rc);
    return ms;
}

void DFlashDrafter::remove(int32_t seq, llama_pos p0) {
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), seq, p0, -1);
}

void DFlashDrafter::clear() {
    llama_memory_clear(llama_get_memory(ctx_.get()), true);
    for (Deferred& d : deferred_) d.drop();
}

void DFlashDrafter::clear(int32_t seq) {
    // removing a whole sequence cannot fail (llama.cpp refuses only partial removals)
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), seq, -1, -1);
    deferred_[static_cast<size_t>(seq)].drop();
}

const float* DFlashDrafter::nextn_row(int32_t row) {
    const float* r = llama_get_embeddings_nextn_ith(ctx_.get(), row);
    if (r == nullptr) fail_.fail_decode("reading the drafter's nextn output", -1);
    return r;
}

std::vector<llama_token> DFlashDrafter::read_lattice(Sequence& s, int32_t row0, int32_t n,
                                                     const DraftControl& control) {
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
        if (t < 0 || t >= n_vocab_) break;  // never for a lattice the graph wrote
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

std::vector<llama_token> DFlashDrafter::read_block(Sequence& s, int32_t row0, int32_t n, const DraftControl& control,
                                                   std::vector<Distribution>& q, Acceptor& rules) {
    Sampler& sampler = *s.sampler;
    const SamplingParams& sp = sampler.params();
    const bool rejection = !sp.greedy() && sp.verify == VerifyMode::Rejection;
    const bool coupled = !sp.greedy() && sp.verify == VerifyMode::Coupled;
    const int32_t n_vocab = n_vocab_;
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
        const float* logits = llama_get_logits_ith(ctx_.get(), row0 + i);
        if (logits == nullptr) fail_.fail_decode("reading drafter logits", -1);
        llama_token t;
        float conf;
        const float* row = logits;
        if (g && !(plain && sp.greedy())) {
            row = rules.constrain(s, logits, *g, plain);
            if (row == nullptr) break;  // the grammar allows nothing more: the block ends
        }
        if (plain && sp.greedy()) {
            t = g ? rules.grammar_argmax(s, logits, *g) : argmax(logits, n_vocab);
            if (t < 0) break;  // the grammar allows nothing more: the block ends
            conf = control.draft_p_min > 0.0f && !head_conf ? draft_confidence(logits, n_vocab, t) : 1.0f;
        } else {
            // q: the drafter's row under the target's transform (and the grammar)
            sampler.distribution(row, win, dist_);
            if (rejection) {
                t = sampler.sample(dist_);
                conf = dist_.prob_of(t);
            } else if (coupled) {  // q's Gumbel-max under the target's noise at this position
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

}  // namespace pydflash
