// Verification of drafted blocks against the rows of the target's last pass:
// the accept loop (the longest agreeing prefix, llama.cpp's match rule, or
// speculative sampling with residual resampling), the grammar mask that the
// target's rows and the drafter's go through, and the emitted tokens'
// logprobs, with the scratch rows they share.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "decode_failure.h"
#include "grammar.h"
#include "llama.h"
#include "sampler.h"
#include "sequence.h"

namespace pydflash {

class Acceptor {
public:
    // `target`: the context whose last pass holds the rows (the pair's; not owned, outlives this).
    Acceptor(llama_context* target, int32_t n_vocab, DecodeFailure& fail);
    Acceptor(const Acceptor&) = delete;
    Acceptor& operator=(const Acceptor&) = delete;

    // Accept/reject `draft` against the rows of the last target pass from row0; q: the
    // drafter's distributions (rejection sampling), empty for a deterministic draft.
    std::vector<llama_token> accept(Sequence& s, int32_t row0, const std::vector<llama_token>& draft,
                                    const std::vector<Distribution>& q, bool external, int32_t& n_accepted,
                                    std::vector<TokenLogprob>& logprobs);
    // The row with what the grammar disallows at -inf (a copy); null if it allows nothing.
    // `plain`: no penalties or bias (the chain sees the row in logit order).
    const float* constrain(const Sequence& s, const float* raw, Grammar& grammar, bool plain);
    // The greedy choice of a plain chain under the grammar (-1: it allows nothing).
    llama_token grammar_argmax(const Sequence& s, const float* raw, Grammar& grammar);

private:
    // Appends the logprob of `t` taken from the row `raw` (SamplingParams.logprobs).
    void note_logprob(const Sequence& s, const float* raw, llama_token t, bool have_dist,
                      std::vector<TokenLogprob>& out) const;

    llama_context* ctx_tgt_;
    int32_t n_vocab_;
    DecodeFailure& fail_;
    Distribution dist_;
    std::vector<float> masked_;                         // a grammar-masked logits row
    std::vector<std::pair<float, llama_token>> order_;  // a row's tokens by logit (grammar scans)
};

}  // namespace pydflash
