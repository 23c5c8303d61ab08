// The options of a ContextPair (fixed at creation) and of one step, with the
// rules their values must follow. The binding builds these field by field and
// the Python layer reads their defaults from a default-constructed instance.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fields.h"
#include "llama.h"

namespace pydflash {

// llama.cpp's n-gram drafters' settings: its --spec-ngram-* options, with its
// defaults (ngram.cpp reads them from common_params_speculative).
struct NgramParams {
    int32_t mod_n_match = 0;    // ngram-mod: lookup length
    int32_t mod_n_min = 0;      // ngram-mod: a shorter draft is dropped
    int32_t mod_n_max = 0;      // ngram-mod: longest draft
    int32_t simple_size_n = 0;  // ngram-simple: lookup length
    int32_t simple_size_m = 0;  // ngram-simple: draft length
    int32_t map_k_size_n = 0;   // ngram-map-k
    int32_t map_k_size_m = 0;
    int32_t map_k_min_hits = 0;
    int32_t map_k4v_size_n = 0;  // ngram-map-k4v
    int32_t map_k4v_size_m = 0;
    int32_t map_k4v_min_hits = 0;

    NgramParams();          // llama.cpp's defaults
    void validate() const;  // its ranges; InvalidArgument naming the option
};

// The default window of a drafter without its own sliding window: the training context of
// the published Qwen3.5-27B DFlash drafter, past which its acceptance collapses (README
// "Drafter window"; benchmarks/draft_window_bench.py measures a pair).
constexpr int32_t kDefaultDraftWindow = 4096;

struct PairParams {
    int32_t n_ctx = 4096;             // all sequences together; each gets n_ctx / n_seq (llama.cpp's -c, -np)
    int32_t n_seq = 1;                // sequences decoded together (llama.cpp's -np)
    bool kv_unified = false;          // each sequence may fill all n_ctx cells (llama.cpp's -kvu)
    bool offload_kqv = true;          // KV caches and attention on the layers' GPU (false: llama.cpp's -nkvo)
    int32_t n_batch = 512;            // largest single decode (prefill chunk)
    int32_t n_ubatch = 512;           // physical batch; also the drafter's injection chunk
    int32_t n_threads = 0;            // 0 = number of hardware threads
    int32_t n_threads_batch = 0;      // prompt and batch passes; 0 = as n_threads
    float rope_freq_base = 0.0f;      // the target's RoPE base; 0 = the model's
    int32_t draft_max = -1;           // default draft length; -1 = block_size - 1
    std::string rollback = "auto";    // or a RollbackKind name, to force one
    std::string flash_attn = "auto";  // "auto", "on" or "off", for both contexts
    std::string type_k = "f16";       // the target's KV cache types
    std::string type_v = "f16";
    std::string draft_type_k = "f16";  // the drafter's
    std::string draft_type_v = "f16";
    // the drafter's context window (draft_window.cpp): its attention and KV cache hold the
    // target features of the last draft_window positions only; 0: the whole context;
    // -1: the drafter's own sliding window if it has one, else kDefaultDraftWindow
    int32_t draft_window = -1;
    // llama.cpp's --spec-type list: n-gram drafters and "draft-dflash" (the
    // drafter) or "draft-mtp" (the target's MTP head), tried in llama.cpp's fixed
    // priority order (n-gram first); empty: the drafter alone when there is one,
    // else plain decoding
    std::vector<std::string> speculative;
    NgramParams ngram;

    // InvalidArgument naming the first bad value (no model needed).
    void validate() const;
    // one sequence's limit; unified: all cells, shared (a decode that finds none fails them all)
    int32_t n_ctx_seq() const { return kv_unified ? n_ctx : n_ctx / n_seq; }
};

// llama.cpp's context parameters of the target or the drafter (n_seq sequences
// in one unified KV cache, no state planes: the caller sets n_rs_seq).
llama_context_params context_params(const PairParams& p, bool drafter);

// Draft-length controls of one step: DraftControl's plain fields (fields.h).
#define PYDFLASH_DRAFT_CONTROL_FIELDS(X)                                                                       \
    X(int32_t, draft_max, -1, "the drafter's block: < 0 the pair's default; 0 none (n-gram drafts still run)") \
    X(int32_t, draft_min, 0, "a shorter draft is dropped (plain decoding this step)")                          \
    X(float, draft_p_min, 0.0f, "cut the block where the drafter's confidence falls below this")               \
    X(int32_t, budget, -1, "at most this many draft tokens from any source (tokens left); -1: no limit")

struct DraftControl {
    PYDFLASH_DRAFT_CONTROL_FIELDS(PYDFLASH_DECLARE_FIELD)

    void validate() const;
};

}  // namespace pydflash
