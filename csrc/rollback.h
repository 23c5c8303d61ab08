// How rejected draft tokens leave the target's memory.
//
// An attention-only target trims its KV cache. A recurrent or hybrid target
// (Gated-DeltaNet, Mamba layers) cannot un-apply tokens to its state, so it
// either keeps per-token state planes (llama.cpp's n_rs_seq: a partial
// seq_rm of up to n_rs_seq tokens then selects an earlier plane; qwen35,
// qwen35moe and a few more architectures), or saves its recurrent state before
// verification and, on a partial acceptance, restores it and replays the
// accepted tokens (every other recurrent architecture, e.g. qwen3next).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "handles.h"
#include "model.h"

namespace pydflash {

enum class RollbackKind { KvTrim, RecurrentPlanes, Checkpoint };

// "kv-trim", "recurrent-planes", "checkpoint"
const char* rollback_name(RollbackKind kind);

// Whether the target keeps a recurrent state a KV trim cannot roll back.
bool has_recurrent_state(const Model& target);

// What a DFlash pair on this target gets with rollback "auto", asked of
// llama.cpp by creating a small context (for `pydflash info`).
std::string auto_rollback_for_drafting(const Model& target);

// One sequence's recurrent state in the target, saved before a verification pass.
class StateCheckpoint {
public:
    // Both throw RollbackError when llama.cpp cannot save or restore the state.
    void save(llama_context* ctx, llama_seq_id seq);
    void restore(llama_context* ctx, llama_seq_id seq);
    size_t size_bytes() const { return size_; }

private:
    std::vector<uint8_t> buf_;
    size_t size_ = 0;
};

}  // namespace pydflash
