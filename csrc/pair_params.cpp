#include "pair_params.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>

#include "errors.h"
#include "ngram.h"
#include "options.h"

namespace pydflash {
namespace {

void at_least(const char* name, int32_t value, int32_t minimum) {
    if (value < minimum) {
        throw InvalidArgument(std::string(name) + " must be >= " + std::to_string(minimum) + ", got " +
                              std::to_string(value));
    }
}

// quantized V needs flash attention in llama.cpp (it refuses the context otherwise)
void check_v_type(const char* name, const std::string& type, const std::string& flash_attn) {
    if (flash_attn == "off" && ggml_is_quantized(parse_cache_type(name, type))) {
        throw InvalidArgument(std::string(name) + "='" + type +
                              "' is quantized, which needs flash_attn 'on' or 'auto'");
    }
}

}  // namespace

void PairParams::validate() const {
    at_least("n_ctx", n_ctx, 8);
    at_least("n_parallel", n_seq, 1);
    constexpr int32_t kMaxSeq = 256;  // llama.cpp's LLAMA_MAX_SEQ (an internal header)
    if (n_seq > kMaxSeq) {
        throw InvalidArgument("n_parallel must be <= " + std::to_string(kMaxSeq) + ", got " + std::to_string(n_seq));
    }
    if (!kv_unified && n_ctx / n_seq < 8) {
        throw InvalidArgument("n_ctx " + std::to_string(n_ctx) + " split over n_parallel " + std::to_string(n_seq) +
                              " sequences leaves fewer than 8 tokens each");
    }
    at_least("n_batch", n_batch, 1);
    at_least("n_ubatch", n_ubatch, 1);
    at_least("n_threads", n_threads, 0);
    at_least("n_threads_batch", n_threads_batch, 0);
    if (!(rope_freq_base >= 0.0f) || !std::isfinite(rope_freq_base)) {
        throw InvalidArgument("rope_freq_base must be a finite number >= 0 (0: the model's), got " +
                              std::to_string(rope_freq_base));
    }
    at_least("draft_max", draft_max, -1);
    at_least("draft_window", draft_window, -1);
    check_choice("rollback", rollback);
    check_choice("flash_attn", flash_attn);
    check_choice("type_k", type_k);
    check_choice("type_v", type_v);
    check_choice("draft_type_k", draft_type_k);
    check_choice("draft_type_v", draft_type_v);
    check_v_type("type_v", type_v, flash_attn);
    check_v_type("draft_type_v", draft_type_v, flash_attn);
    check_speculative_types(speculative);
    if (std::any_of(speculative.begin(), speculative.end(), is_ngram_type)) ngram.validate();
}

llama_context_params context_params(const PairParams& p, bool drafter) {
    llama_context_params cp = llama_context_default_params();
    cp.flash_attn_type = parse_flash_attn(p.flash_attn);
    cp.type_k = parse_cache_type(drafter ? "draft_type_k" : "type_k", drafter ? p.draft_type_k : p.type_k);
    cp.type_v = parse_cache_type(drafter ? "draft_type_v" : "type_v", drafter ? p.draft_type_v : p.type_v);
    cp.n_ctx = static_cast<uint32_t>(p.n_ctx);
    cp.n_batch = static_cast<uint32_t>(p.n_batch);
    cp.n_ubatch = static_cast<uint32_t>(p.n_ubatch);
    cp.n_seq_max = static_cast<uint32_t>(p.n_seq);
    // one KV stream for all sequences: a batch of several sequences' blocks stays one
    // ubatch (the drafter's non-causal block must not be split); the per-sequence
    // limit n_ctx / n_seq is the pair's to keep
    cp.kv_unified = true;
    cp.n_rs_seq = 0;
    cp.offload_kqv = p.offload_kqv;
    int32_t threads = p.n_threads;
    if (threads <= 0) threads = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    cp.n_threads = threads;
    cp.n_threads_batch = p.n_threads_batch > 0 ? p.n_threads_batch : threads;
    // the drafter keeps its own RoPE: it was trained with it
    if (!drafter) cp.rope_freq_base = p.rope_freq_base;
    cp.no_perf = true;
    return cp;
}

void DraftControl::validate() const {
    at_least("draft_max", draft_max, -1);
    at_least("draft_min", draft_min, 0);
    at_least("budget", budget, -1);
    if (!(draft_p_min >= 0.0f && draft_p_min <= 1.0f)) {
        throw InvalidArgument("draft_p_min must be in [0, 1], got " + std::to_string(draft_p_min));
    }
}

}  // namespace pydflash
