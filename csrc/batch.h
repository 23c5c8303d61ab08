// Filling a llama.cpp batch, shared by the pair's decode paths.
#pragma once

#include <string>

#include "errors.h"
#include "llama-ext.h"

namespace pydflash {

// One token of sequence `seq` at `pos` (4 positions for M-RoPE models); with
// `output`, its logits are kept.
inline void add_token(llama_batch_ext* b, llama_seq_id seq, llama_token id, llama_pos pos, bool output) {
    const int32_t idx = llama_batch_ext_add_token(b, seq, id);
    if (idx < 0) throw Error("batch is full (llama_batch_ext_add_token returned " + std::to_string(idx) + ")");
    const llama_pos p4[4] = {pos, pos, pos, 0};
    if (!llama_batch_ext_set_pos(b, idx, p4)) throw Error("llama_batch_ext_set_pos failed");
    if (output && !llama_batch_ext_set_output_logits(b, idx, true)) {
        throw Error("llama_batch_ext_set_output_logits failed");
    }
}

}  // namespace pydflash
