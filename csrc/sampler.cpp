#include "sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>

#include "coupled.h"
#include "errors.h"
#include "options.h"

namespace pydflash {

VerifyMode parse_verify(const std::string& name) {
    check_choice("verify", name);
    if (name == "coupled") return VerifyMode::Coupled;
    return name == "match" ? VerifyMode::Match : VerifyMode::Rejection;
}

const char* verify_name(VerifyMode mode) {
    if (mode == VerifyMode::Coupled) return "coupled";
    return mode == VerifyMode::Match ? "match" : "rejection";
}

void SamplingParams::validate(int32_t n_vocab) const {
    auto finite = [](float v) { return std::isfinite(v); };
    if (!finite(temperature) || temperature < 0.0f) {
        throw InvalidArgument("temperature must be a finite number >= 0, got " + std::to_string(temperature));
    }
    if (top_k < 0) throw InvalidArgument("top_k must be >= 0, got " + std::to_string(top_k));
    if (!(top_p > 0.0f && top_p <= 1.0f))
        throw InvalidArgument("top_p must be in (0, 1], got " + std::to_string(top_p));
    if (!(min_p >= 0.0f && min_p < 1.0f))
        throw InvalidArgument("min_p must be in [0, 1), got " + std::to_string(min_p));
    if (!(typical_p > 0.0f && typical_p <= 1.0f))
        throw InvalidArgument("typical_p must be in (0, 1], got " + std::to_string(typical_p));
    if (!finite(top_n_sigma)) throw InvalidArgument("top_n_sigma must be a finite number (<= 0: off)");
    if (!finite(repeat_penalty) || repeat_penalty <= 0.0f) {
        throw InvalidArgument("repeat_penalty must be > 0, got " + std::to_string(repeat_penalty));
    }
    if (!finite(frequency_penalty) || !finite(presence_penalty)) {
        throw InvalidArgument("frequency_penalty and presence_penalty must be finite");
    }
    if (penalty_last_n < 0) throw InvalidArgument("penalty_last_n must be >= 0");
    if (top_logprobs < 0) throw InvalidArgument("top_logprobs must be >= 0, got " + std::to_string(top_logprobs));
    if (top_logprobs > 0 && !logprobs) throw InvalidArgument("top_logprobs needs logprobs=True");
    if (n_vocab > 0 && top_logprobs > n_vocab) {
        throw InvalidArgument("top_logprobs must be <= n_vocab (" + std::to_string(n_vocab) + "), got " +
                              std::to_string(top_logprobs));
    }
    for (const auto& [tok, bias] : logit_bias) {
        if (tok < 0 || (n_vocab > 0 && tok >= n_vocab)) {
            throw InvalidArgument("logit_bias token " + std::to_string(tok) + " is out of range [0, " +
                                  (n_vocab > 0 ? std::to_string(n_vocab) : std::string("n_vocab")) + ")");
        }
        if (std::isnan(bias)) throw InvalidArgument("logit_bias values must not be NaN");
    }
}

float Distribution::prob_of(llama_token t) const {
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == t) return probs[i];
    }
    return 0.0f;
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

float draft_confidence(const float* logits, int32_t n_vocab, llama_token token) {
    // the DRAFT_TOP_K largest logits, descending (one pass; most values fail the first test)
    std::array<float, DRAFT_TOP_K> top{};
    int32_t n = 0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        const float v = logits[i];
        if (n == DRAFT_TOP_K && !(v > top[n - 1])) continue;
        int32_t j = n < DRAFT_TOP_K ? n++ : n - 1;
        for (; j > 0 && top[j - 1] < v; --j) top[j] = top[j - 1];
        top[j] = v;
    }
    const float lt = logits[token];
    if (n == 0 || lt < top[n - 1]) return 0.0f;  // outside the top k: llama.cpp never drafts it
    // llama.cpp's softmax (llama_sampler_softmax_impl): in float, summed in descending order
    float sum = 0.0f;
    for (int32_t i = 0; i < n; ++i) sum += std::exp(top[i] - top[0]);
    return std::exp(lt - top[0]) / sum;
}

namespace {

// (value, id) ordering for "most likely first": higher value, then lower id.
bool ranks_before(const std::pair<float, llama_token>& a, const std::pair<float, llama_token>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// The top_n of (value, id) pairs, best first.
std::vector<std::pair<float, llama_token>> top_entries(std::vector<std::pair<float, llama_token>> v, int32_t top_n) {
    const auto n = std::min<size_t>(v.size(), static_cast<size_t>(std::max(top_n, 0)));
    std::partial_sort(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n), v.end(), ranks_before);
    v.resize(n);
    return v;
}

}  // namespace

TokenLogprob raw_logprob(const float* logits, int32_t n_vocab, llama_token token, int32_t top_n) {
    const float mx = logits[argmax(logits, n_vocab)];
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
    const double lse = static_cast<double>(mx) + std::log(sum);
    TokenLogprob out;
    out.token = token;
    out.logprob = static_cast<float>(static_cast<double>(logits[token]) - lse);
    if (top_n <= 0) return out;
    // a bounded heap over the row: the worst of the best top_n on top
    std::vector<std::pair<float, llama_token>> heap;
    heap.reserve(static_cast<size_t>(top_n) + 1);
    for (int32_t i = 0; i < n_vocab; ++i) {
        const std::pair<float, llama_token> e{logits[i], i};
        if (heap.size() < static_cast<size_t>(top_n)) {
            heap.push_back(e);
            std::push_heap(heap.begin(), heap.end(), ranks_before);
        } else if (ranks_before(e, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), ranks_before);
            heap.back() = e;
            std::push_heap(heap.begin(), heap.end(), ranks_before);
        }
    }
    for (const auto& [v, id] : top_entries(std::move(heap), top_n)) {
        out.top.emplace_back(id, static_cast<float>(static_cast<double>(v) - lse));
    }
    return out;
}

TokenLogprob distribution_logprob(const Distribution& d, llama_token token, int32_t top_n) {
    TokenLogprob out;
    out.token = token;
    const float p = d.prob_of(token);
    out.logprob = p > 0.0f ? std::log(p) : -std::numeric_limits<float>::infinity();
    if (top_n <= 0) return out;
    std::vector<std::pair<float, llama_token>> v;
    v.reserve(d.ids.size());
    for (size_t i = 0; i < d.ids.size(); ++i) v.emplace_back(d.probs[i], d.ids[i]);
    for (const auto& [prob, id] : top_entries(std::move(v), top_n)) out.top.emplace_back(id, std::log(prob));
    return out;
}

Sampler::Sampler(const SamplingParams& params, int32_t n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(params.seed) {
    params_.validate(n_vocab);
    if (params_.greedy()) return;
    // llama.cpp's default chain after the bias and penalties, with llama-server's
    // default min_keep (0)
    if (params_.top_n_sigma > 0.0f) top_n_sigma_.reset(llama_sampler_init_top_n_sigma(params_.top_n_sigma));
    cuts_.reset(llama_sampler_chain_init(llama_sampler_chain_default_params()));
    llama_sampler* chain = cuts_.get();
    if (params_.top_k > 0) llama_sampler_chain_add(chain, llama_sampler_init_top_k(params_.top_k));
    if (params_.typical_p < 1.0f) llama_sampler_chain_add(chain, llama_sampler_init_typical(params_.typical_p, 0));
    if (params_.top_p < 1.0f) llama_sampler_chain_add(chain, llama_sampler_init_top_p(params_.top_p, 0));
    if (params_.min_p > 0.0f) llama_sampler_chain_add(chain, llama_sampler_init_min_p(params_.min_p, 0));
    llama_sampler_chain_add(chain, llama_sampler_init_temp(params_.temperature));
}

double Sampler::uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

const float* Sampler::adjusted(const float* logits, const std::vector<llama_token>& recent) {
    if (!params_.has_penalties() && params_.logit_bias.empty()) return logits;
    work_.assign(logits, logits + n_vocab_);
    // llama.cpp's chain adds the bias first, then the penalties see the biased logits
    for (const auto& [t, b] : params_.logit_bias) work_[static_cast<size_t>(t)] += b;
    if (params_.has_penalties() && !recent.empty()) {
        std::unordered_map<llama_token, int> count;
        for (llama_token t : recent) ++count[t];
        for (const auto& [t, c] : count) {
            if (t < 0 || t >= n_vocab_) continue;
            float& v = work_[static_cast<size_t>(t)];
            v = v > 0.0f ? v / params_.repeat_penalty : v * params_.repeat_penalty;  // llama.cpp's rule
            v -= static_cast<float>(c) * params_.frequency_penalty + params_.presence_penalty;
        }
    }
    return work_.data();
}

bool Sampler::forced(const float* row, Distribution& out) {
    // a +inf logit (a +inf bias) takes all the probability: the softmax's limit, which the
    // chain cannot compute (inf - inf is NaN); several share it evenly
    for (int32_t i = 0; i < n_vocab_; ++i) {
        if (row[i] == std::numeric_limits<float>::infinity()) out.ids.push_back(i);
    }
    out.probs.assign(out.ids.size(), out.ids.empty() ? 0.0f : 1.0f / static_cast<float>(out.ids.size()));
    return !out.ids.empty();
}

void Sampler::distribution(const float* logits, const std::vector<llama_token>& recent, Distribution& out) {
    out.ids.clear();
    out.probs.clear();
    const float* row = adjusted(logits, recent);
    if (params_.greedy()) {
        out.ids.push_back(argmax(row, n_vocab_));
        out.probs.push_back(1.0f);
        return;
    }
    if (forced(row, out)) return;
    // candidates: the finite logits (a -inf bias or a grammar removes a token)
    cand_.clear();
    for (int32_t i = 0; i < n_vocab_; ++i) {
        if (std::isfinite(row[i])) cand_.push_back({i, row[i], 0.0f});
    }
    if (cand_.empty()) cand_.push_back({0, row[0], 0.0f});  // nothing finite: keep the first, as llama.cpp does
    llama_token_data_array arr{cand_.data(), cand_.size(), -1, false};
    if (top_n_sigma_) {
        // it marks what it drops with -inf; they leave here, so that typical-p's
        // entropy never sees p = 0 (0 * log 0 is NaN in llama.cpp's arithmetic)
        llama_sampler_apply(top_n_sigma_.get(), &arr);
        arr.size =
            static_cast<size_t>(std::remove_if(arr.data, arr.data + arr.size,
                                               [](const llama_token_data& d) { return !std::isfinite(d.logit); }) -
                                arr.data);
    }
    llama_sampler_apply(cuts_.get(), &arr);  // top-k, typical-p, top-p, min-p, temperature
    // the survivors, most likely first (ties: lower id), with their softmax
    std::sort(arr.data, arr.data + arr.size, [](const llama_token_data& a, const llama_token_data& b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    });
    double sum = 0.0;
    for (size_t i = 0; i < arr.size; ++i) sum += std::exp(static_cast<double>(arr.data[i].logit - arr.data[0].logit));
    out.ids.reserve(arr.size);
    out.probs.reserve(arr.size);
    for (size_t i = 0; i < arr.size; ++i) {
        out.ids.push_back(arr.data[i].id);
        out.probs.push_back(
            static_cast<float>(std::exp(static_cast<double>(arr.data[i].logit - arr.data[0].logit)) / sum));
    }
}

llama_token Sampler::sample(const Distribution& d) {
    if (d.ids.size() == 1) return d.ids[0];
    const double r = uniform();
    double acc = 0.0;
    for (size_t i = 0; i < d.ids.size(); ++i) {
        acc += d.probs[i];
        if (r < acc) return d.ids[i];
    }
    return d.ids.back();
}

llama_token Sampler::draw(const Distribution& d, llama_pos pos) {
    if (params_.verify == VerifyMode::Coupled) return coupled_argmax(d, params_.seed, pos);
    return sample(d);
}

llama_token Sampler::sample_residual(const Distribution& p, const Distribution& q) {
    dense_.assign(static_cast<size_t>(n_vocab_), 0.0f);
    for (size_t i = 0; i < p.ids.size(); ++i) dense_[static_cast<size_t>(p.ids[i])] = p.probs[i];
    for (size_t i = 0; i < q.ids.size(); ++i) dense_[static_cast<size_t>(q.ids[i])] -= q.probs[i];
    double sum = 0.0;
    for (llama_token t : p.ids) sum += std::max(0.0f, dense_[static_cast<size_t>(t)]);
    if (!(sum > 0.0)) return sample(p);  // p == q up to rounding: any p-sample is exact
    const double r = uniform() * sum;
    double acc = 0.0;
    for (llama_token t : p.ids) {
        acc += std::max(0.0f, dense_[static_cast<size_t>(t)]);
        if (r < acc) return t;
    }
    return p.ids.back();
}

}  // namespace pydflash
