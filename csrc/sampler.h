// Token distributions and sampling. One transform, llama.cpp's default chain
// in its order and meaning (logit bias, penalties, top-n-sigma, top-k,
// typical-p, top-p, min-p, then temperature: the cuts see the untempered
// distribution), turns a row of logits into a sparse distribution; the
// target's p and the drafter's q go through the same transform, which keeps
// speculative rejection sampling exact.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fields.h"
#include "llama.h"

namespace pydflash {

enum class VerifyMode { Match, Rejection, Coupled };
VerifyMode parse_verify(const std::string& name);  // "rejection", "match" or "coupled"
const char* verify_name(VerifyMode mode);

// SamplingParams' plain fields (fields.h). Logprobs come from the verify pass's rows:
// of the raw logits (the model's), or with post_sampling_probs of the sampler chain's
// distribution (llama-server's post_sampling_probs).
#define PYDFLASH_SAMPLING_FIELDS(X)                                                                 \
    X(float, temperature, 0.0f, "0: greedy")                                                        \
    X(int32_t, top_k, 0, "0: the whole vocabulary")                                                 \
    X(float, top_p, 1.0f, "1: no nucleus cut")                                                      \
    X(float, min_p, 0.0f, "drop tokens below min_p * p(best)")                                      \
    X(float, typical_p, 1.0f, "locally typical sampling; 1: off")                                   \
    X(float, top_n_sigma, -1.0f, "keep logits within n standard deviations of the best; <= 0: off") \
    X(float, repeat_penalty, 1.0f, "a recent token's logit: positive / it, negative * it; 1: off")  \
    X(float, frequency_penalty, 0.0f, "subtracted from a recent token's logit per occurrence")      \
    X(float, presence_penalty, 0.0f, "subtracted once from each recent token's logit")              \
    X(int32_t, penalty_last_n, 64, "window of recent tokens the penalties look at")                 \
    X(uint64_t, seed, 0, "the sampler's random seed")                                               \
    X(bool, logprobs, false, "log-probabilities of the new tokens (StepResult.logprobs)")           \
    X(int32_t, top_logprobs, 0, "and the N most likely tokens at each position")                    \
    X(bool, post_sampling_probs, false, "logprobs of the sampler chain's distribution, not the raw logits")

struct SamplingParams {
    PYDFLASH_SAMPLING_FIELDS(PYDFLASH_DECLARE_FIELD)
    std::vector<std::pair<llama_token, float>> logit_bias;
    VerifyMode verify = VerifyMode::Rejection;  // used at temperature > 0

    bool greedy() const { return temperature <= 0.0f || top_k == 1; }
    bool has_penalties() const {
        return repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
    }
    // InvalidArgument on nonsense values; n_vocab <= 0: token ids checked only for >= 0
    void validate(int32_t n_vocab) const;
};

// A distribution over a few tokens; probabilities sum to 1.
struct Distribution {
    std::vector<llama_token> ids;
    std::vector<float> probs;
    float prob_of(llama_token t) const;
};

// One new token's log-probability and the most likely tokens at its position
// (highest first; ties: lower id first).
struct TokenLogprob {
    llama_token token = 0;
    float logprob = 0.0f;
    std::vector<std::pair<llama_token, float>> top;
};

// From a raw logits row: log_softmax at `token` and the top_n entries.
TokenLogprob raw_logprob(const float* logits, int32_t n_vocab, llama_token token, int32_t top_n);
// From a distribution after the sampler chain (tokens outside it: -inf).
TokenLogprob distribution_logprob(const Distribution& d, llama_token token, int32_t top_n);

class Sampler {
public:
    Sampler(const SamplingParams& params, int32_t n_vocab);
    const SamplingParams& params() const { return params_; }

    // The transformed distribution of one logits row; `recent` are the tokens
    // the penalties count (oldest first, already cut to penalty_last_n).
    // Greedy settings give a one-hot distribution at the transformed argmax.
    void distribution(const float* logits, const std::vector<llama_token>& recent, Distribution& out);

    llama_token sample(const Distribution& d);
    // The token of absolute position `pos` from d: verify="coupled" takes the
    // Gumbel-max of the noise shared with the drafters (coupled.h), the others sample(d).
    llama_token draw(const Distribution& d, llama_pos pos);
    double uniform();  // in [0, 1)

    // Residual max(0, p - q), normalised, sampled: the correction after a
    // rejected draft token.
    llama_token sample_residual(const Distribution& p, const Distribution& q);

private:
    struct ChainDeleter {
        void operator()(llama_sampler* s) const noexcept { llama_sampler_free(s); }
    };
    using ChainPtr = std::unique_ptr<llama_sampler, ChainDeleter>;

    SamplingParams params_;
    int32_t n_vocab_;
    std::mt19937_64 rng_;
    std::vector<float> work_;
    std::vector<llama_token_data> cand_;  // the chain's candidates
    std::vector<float> dense_;
    // llama.cpp's own samplers for the cuts and the temperature (no "dist": the
    // distribution they leave is what p and q are)
    ChainPtr top_n_sigma_;
    ChainPtr cuts_;
    const float* adjusted(const float* logits, const std::vector<llama_token>& recent);  // bias, penalties
    // the +inf entries of a row, evenly likely (false: none)
    bool forced(const float* row, Distribution& out);
};

// Index of the largest logit; ties go to the lowest id.
llama_token argmax(const float* logits, int32_t n_vocab);

// The drafter's confidence in `token` that draft_p_min cuts on, as llama.cpp's DFlash
// drafter measures it: its draft sampler keeps the DRAFT_TOP_K largest logits of the
// raw row and takes their softmax at temperature 1 (common/speculative.cpp); 0 for a
// token outside them.
inline constexpr int32_t DRAFT_TOP_K = 10;
float draft_confidence(const float* logits, int32_t n_vocab, llama_token token);

}  // namespace pydflash
