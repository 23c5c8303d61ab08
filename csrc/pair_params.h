// The options of a ContextPair (fixed at creation) and of one step, with the
// rules their values must follow. The binding builds these field by field and
// the Python layer reads their defaults from a default-constructed instance.
#pragma once

#include <cstdint>
#include <string>

#include "llama.h"

namespace pydflash {

struct PairParams {
    int32_t n_ctx = 4096;             // all sequences together; each gets n_ctx / n_seq (llama.cpp's -c, -np)
    int32_t n_seq = 1;                // sequences decoded together (llama.cpp's -np)
    int32_t n_batch = 512;            // largest single decode (prefill chunk)
    int32_t n_ubatch = 512;           // physical batch; also the drafter's injection chunk
    int32_t n_threads = 0;            // 0 = number of hardware threads
    int32_t draft_max = -1;           // default draft length; -1 = block_size - 1
    std::string rollback = "auto";    // or a RollbackKind name, to force one
    std::string flash_attn = "auto";  // "auto", "on" or "off", for both contexts
    std::string type_k = "f16";       // the target's KV cache types
    std::string type_v = "f16";
    std::string draft_type_k = "f16";  // the drafter's
    std::string draft_type_v = "f16";

    // InvalidArgument naming the first bad value (no model needed).
    void validate() const;
};

// llama.cpp's context parameters of the target or the drafter (n_seq sequences
// in one unified KV cache, no state planes: the caller sets n_rs_seq).
llama_context_params context_params(const PairParams& p, bool drafter);

// Draft-length controls of one step.
struct DraftControl {
    int32_t draft_max = -1;    // < 0: the pair's default; 0: plain target decoding
    int32_t draft_min = 0;     // a shorter draft is dropped (plain decoding this step)
    float draft_p_min = 0.0f;  // cut the block where the drafter's confidence falls below this

    void validate() const;
};

}  // namespace pydflash
