// Token selection from one row of logits. Greedy at temperature <= 0, else
// temperature / top-k / top-p sampling from a seeded generator, so a run is
// reproducible for a given seed.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "llama.h"

namespace pydflash {

struct SamplingParams {
    float temperature = 0.0f;
    int32_t top_k = 0;    // 0 = whole vocabulary
    float top_p = 1.0f;   // 1 = no nucleus cut
    uint64_t seed = 0;

    bool greedy() const { return temperature <= 0.0f || top_k == 1; }
    void validate() const;  // InvalidArgument on nonsense values
};

class Sampler {
public:
    Sampler(const SamplingParams& params, int32_t n_vocab);
    llama_token sample(const float* logits);
    const SamplingParams& params() const { return params_; }

private:
    SamplingParams params_;
    int32_t n_vocab_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, llama_token>> cand_;
};

// Index of the largest logit; ties go to the lowest id.
llama_token argmax(const float* logits, int32_t n_vocab);

}  // namespace pydflash
