#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "errors.h"

namespace pydflash {

void SamplingParams::validate() const {
    if (!std::isfinite(temperature) || temperature < 0.0f) {
        throw InvalidArgument("temperature must be a finite number >= 0, got " + std::to_string(temperature));
    }
    if (top_k < 0) throw InvalidArgument("top_k must be >= 0, got " + std::to_string(top_k));
    if (!(top_p > 0.0f && top_p <= 1.0f)) {
        throw InvalidArgument("top_p must be in (0, 1], got " + std::to_string(top_p));
    }
}

llama_token argmax(const float* logits, int32_t n_vocab) {
    int32_t best = 0;
    float best_v = logits[0];
    for (int32_t i = 1; i < n_vocab; ++i) {
        if (logits[i] > best_v) {
            best_v = logits[i];
            best = i;
        }
    }
    return best;
}

Sampler::Sampler(const SamplingParams& params, int32_t n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(params.seed) {
    params_.validate();
}

llama_token Sampler::sample(const float* logits) {
    if (params_.greedy()) return argmax(logits, n_vocab_);

    cand_.resize(static_cast<size_t>(n_vocab_));
    for (int32_t i = 0; i < n_vocab_; ++i) cand_[static_cast<size_t>(i)] = {logits[i], i};
    size_t n = cand_.size();
    const auto by_logit = [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
        n = static_cast<size_t>(params_.top_k);
        std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(n), cand_.end(), by_logit);
    } else {
        std::sort(cand_.begin(), cand_.end(), by_logit);
    }
    // softmax over the kept candidates at this temperature
    const float max_l = cand_[0].first;
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double p = std::exp(static_cast<double>(cand_[i].first - max_l) / params_.temperature);
        cand_[i].first = static_cast<float>(p);
        sum += p;
    }
    if (params_.top_p < 1.0f) {
        double acc = 0.0;
        size_t keep = n;
        for (size_t i = 0; i < n; ++i) {
            acc += cand_[i].first / sum;
            if (acc >= params_.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0.0;
        for (size_t i = 0; i < n; ++i) sum += cand_[i].first;
    }
    std::uniform_real_distribution<double> uni(0.0, sum);
    const double r = uni(rng_);
    double acc = 0.0;
    for (size_t i = 0; i < n; ++i) {
        acc += cand_[i].first;
        if (r < acc) return cand_[i].second;
    }
    return cand_[n - 1].second;
}

}  // namespace pydflash
