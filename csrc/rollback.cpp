#include "rollback.h"

#include "backend.h"
#include "errors.h"

namespace pydflash {

const char* rollback_name(RollbackKind kind) {
    switch (kind) {
        case RollbackKind::KvTrim: return "kv-trim";
        case RollbackKind::RecurrentPlanes: return "recurrent-planes";
        case RollbackKind::Checkpoint: return "checkpoint";
    }
    return "?";
}

bool has_recurrent_state(const Model& target) { return target.is_recurrent() || target.is_hybrid(); }

std::string auto_rollback_for_drafting(const Model& target) {
    if (!has_recurrent_state(target)) return rollback_name(RollbackKind::KvTrim);
    // llama.cpp clamps n_rs_seq to 0 for architectures without partial rollback
    ensure_backend();
    take_thread_errors();
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 32;
    cp.n_ubatch = 32;
    cp.n_seq_max = 1;
    cp.n_rs_seq = 1;
    cp.no_perf = true;
    ContextPtr ctx(llama_init_from_model(target.get(), cp));
    if (!ctx) throw Error(target.path() + ": failed to create a probe context: " + take_thread_errors());
    return rollback_name(llama_n_rs_seq(ctx.get()) > 0 ? RollbackKind::RecurrentPlanes : RollbackKind::Checkpoint);
}

void StateCheckpoint::save(llama_context* ctx, llama_seq_id seq) {
    // the recurrent part only: the attention KV cache is trimmed with seq_rm
    const size_t need = llama_state_seq_get_size_ext(ctx, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    if (need == 0) throw RollbackError("the target's recurrent state has size 0; cannot checkpoint it");
    if (buf_.size() < need) buf_.resize(need);
    size_ = llama_state_seq_get_data_ext(ctx, buf_.data(), need, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    if (size_ == 0 || size_ > need) {
        size_ = 0;
        throw RollbackError("saving the target's recurrent state failed");
    }
}

void StateCheckpoint::restore(llama_context* ctx, llama_seq_id seq) {
    if (size_ == 0) throw RollbackError("no recurrent-state checkpoint to restore");
    const size_t read = llama_state_seq_set_data_ext(ctx, buf_.data(), size_, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    if (read != size_) throw RollbackError("restoring the target's recurrent state failed");
}

}  // namespace pydflash
