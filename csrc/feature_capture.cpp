#include "feature_capture.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <utility>

#include "backend.h"
#include "batch.h"
#include "drafter.h"
#include "errors.h"
#include "llama-ext.h"
#include "sampler.h"  // argmax: the pair's greedy pick

namespace pydflash {

FeatureCapture::FeatureCapture(std::shared_ptr<Model> model, std::vector<int32_t> layer_ids, int32_t n_ctx,
                               int32_t n_batch, int32_t n_threads, int32_t n_seq)
    : model_(std::move(model)), layer_ids_(std::move(layer_ids)), n_ctx_(n_ctx), n_batch_(n_batch), n_seq_(n_seq) {
    if (!target_exposes_layer_inputs(model_->architecture())) {
        throw DraftCompatibilityError(model_->path() + ": target architecture '" + model_->architecture() +
                                      "' does not expose layer inputs in llama.cpp, so no drafter can read its "
                                      "features");
    }
    if (model_->is_recurrent() || model_->is_hybrid()) {
        // one fresh sequence per capture is all this needs, but a recurrent state is not
        // a per-position cache: refuse rather than capture what a drafter never sees
        throw DraftCompatibilityError(model_->path() +
                                      ": feature capture for recurrent or hybrid targets is "
                                      "not supported");
    }
    if (layer_ids_.empty()) throw InvalidArgument("feature capture needs at least one target layer id");
    for (int32_t id : layer_ids_) {
        if (id < 0 || id >= model_->n_layer()) {
            throw InvalidArgument("target layer id " + std::to_string(id) + " is out of range: the target has " +
                                  std::to_string(model_->n_layer()) + " layers (valid ids 0.." +
                                  std::to_string(model_->n_layer() - 1) + ")");
        }
    }
    if (n_ctx < 1) throw InvalidArgument("the capture context must hold at least 1 token");
    if (n_batch < 1) throw InvalidArgument("n_batch must be at least 1");
    constexpr int32_t kMaxSeq = 256;  // llama.cpp's LLAMA_MAX_SEQ (an internal header)
    if (n_seq < 1 || n_seq > kMaxSeq) {
        throw InvalidArgument("n_seq must be in [1, " + std::to_string(kMaxSeq) + "], got " + std::to_string(n_seq));
    }
    n_batch_ = std::min(n_batch, n_ctx);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<uint32_t>(static_cast<int64_t>(n_ctx) * n_seq);  // n_ctx for each sequence
    cp.n_batch = static_cast<uint32_t>(std::max(n_batch_, n_seq));
    cp.n_ubatch = cp.n_batch;
    cp.n_seq_max = static_cast<uint32_t>(n_seq);
    // one KV stream, as the pair's: a pass of several sequences' rows stays one ubatch
    cp.kv_unified = true;
    if (n_threads <= 0) n_threads = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.no_perf = true;
    take_thread_errors();
    ctx_.reset(llama_init_from_model(model_->get(), cp));
    if (!ctx_) {
        throw ModelLoadError(model_->path() + ": failed to create the capture context: " + take_thread_errors());
    }
    batch_.reset(llama_batch_ext_init(ctx_.get()));
    if (!batch_) throw Error("llama_batch_ext_init failed for the capture context");
    // before the first decode: it reserves the graph with the capture outputs
    for (int32_t id : layer_ids_) llama_set_embeddings_layer_inp(ctx_.get(), static_cast<uint32_t>(id), true);
}

CapturedSequence FeatureCapture::capture(const std::vector<llama_token>& tokens, int32_t top_k) {
    if (tokens.empty()) throw InvalidArgument("nothing to capture: the token list is empty");
    if (top_k < 0 || top_k > model_->n_vocab()) {
        throw InvalidArgument("top_k must be in [0, " + std::to_string(model_->n_vocab()) + "], got " +
                              std::to_string(top_k));
    }
    const bool with_logits = top_k > 0;
    if (static_cast<int64_t>(tokens.size()) > n_ctx_) {
        throw ContextLimitError("a sequence of " + std::to_string(tokens.size()) +
                                " tokens does not fit the capture context of " + std::to_string(n_ctx_) + " tokens");
    }
    for (llama_token t : tokens) model_->check_token(t);
    llama_memory_clear(llama_get_memory(ctx_.get()), true);
    const auto n_embd = static_cast<size_t>(model_->n_embd());
    const size_t width = layer_ids_.size() * n_embd;
    const int32_t n_vocab = model_->n_vocab();
    CapturedSequence out;
    out.features.resize(tokens.size() * width);
    out.top.resize(tokens.size() * static_cast<size_t>(top_k));
    out.top_logits.resize(out.top.size());
    std::vector<int32_t> order(static_cast<size_t>(n_vocab));
    llama_batch_ext* b = batch_.get();
    for (size_t start = 0; start < tokens.size(); start += static_cast<size_t>(n_batch_)) {
        const auto n = static_cast<int32_t>(std::min(tokens.size() - start, static_cast<size_t>(n_batch_)));
        llama_batch_ext_clear(b);
        for (int32_t i = 0; i < n; ++i) {
            add_token(b, 0, tokens[start + static_cast<size_t>(i)], static_cast<llama_pos>(start) + i, with_logits);
        }
        take_thread_errors();
        const int32_t rc = llama_process(ctx_.get(), LLAMA_PROCESS_TYPE_DECODE, b);
        if (rc != 0) {
            llama_memory_clear(llama_get_memory(ctx_.get()), true);
            throw DecodeError("feature capture pass failed (llama_process returned " + std::to_string(rc) + ")");
        }
        for (size_t k = 0; k < layer_ids_.size(); ++k) {
            const float* rows = llama_get_embeddings_layer_inp(ctx_.get(), static_cast<uint32_t>(layer_ids_[k]));
            if (rows == nullptr)
                throw DecodeError("llama.cpp returned no layer inputs for layer " + std::to_string(layer_ids_[k]));
            for (int32_t i = 0; i < n; ++i) {
                float* dst = out.features.data() + (start + static_cast<size_t>(i)) * width + k * n_embd;
                std::memcpy(dst, rows + static_cast<size_t>(i) * n_embd, n_embd * sizeof(float));
            }
        }
        if (!with_logits) continue;
        for (int32_t i = 0; i < n; ++i) {
            const float* logits = llama_get_logits_ith(ctx_.get(), i);
            if (logits == nullptr) throw DecodeError("llama.cpp returned no logits for row " + std::to_string(i));
            const size_t row = (start + static_cast<size_t>(i)) * static_cast<size_t>(top_k);
            std::iota(order.begin(), order.end(), 0);
            // the best first; equal logits by token id, so the first is the argmax sampling picks
            std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t x, int32_t y) {
                return logits[x] > logits[y] || (logits[x] == logits[y] && x < y);
            });
            for (int32_t k = 0; k < top_k; ++k) {
                out.top[row + static_cast<size_t>(k)] = order[static_cast<size_t>(k)];
                out.top_logits[row + static_cast<size_t>(k)] = logits[order[static_cast<size_t>(k)]];
            }
        }
    }
    return out;
}

namespace {

// One sequence of generate(): a prompt decoded first (as many tokens per pass as the
// batch has room for), then its reply one token per pass.
struct ReplySlot {
    static constexpr size_t kFree = SIZE_MAX;
    size_t prompt = kFree;
    int32_t n_done = 0;  // tokens of prompt + reply evaluated (their features recorded)
    bool last = false;   // the reply is full: its last token is evaluated for its features only
};

struct ReplyRow {
    size_t slot;
    int32_t pos;
    bool logits;
};

class ReplyPlan {
public:
    ReplyPlan(const std::vector<std::vector<llama_token>>& prompts, std::vector<GeneratedSequence>& out)
        : prompts_(prompts), out_(out) {}

    int32_t n_total(size_t p) const { return static_cast<int32_t>(prompts_[p].size() + out_[p].reply.size()); }
    llama_token token_at(size_t p, int32_t pos) const {
        const auto n_prompt = static_cast<int32_t>(prompts_[p].size());
        return pos < n_prompt ? prompts_[p][static_cast<size_t>(pos)]
                              : out_[p].reply[static_cast<size_t>(pos - n_prompt)];
    }

    // The next pass's rows: every generating slot's one token first, so a long prompt never
    // holds the others back, then prompt tokens while there is room.
    std::vector<ReplyRow> rows(const std::vector<ReplySlot>& slots, int32_t room) const {
        std::vector<ReplyRow> rows;
        for (int pass = 0; pass < 2; ++pass) {
            for (size_t s = 0; s < slots.size() && room > 0; ++s) {
                const ReplySlot& sl = slots[s];
                if (sl.prompt == ReplySlot::kFree) continue;
                const bool prefilling = sl.n_done < static_cast<int32_t>(prompts_[sl.prompt].size());
                if (prefilling != (pass == 1)) continue;
                const int32_t end = prefilling ? std::min(n_total(sl.prompt), sl.n_done + room) : sl.n_done + 1;
                for (int32_t pos = sl.n_done; pos < end; ++pos) {
                    rows.push_back({s, pos, pos == n_total(sl.prompt) - 1 && !sl.last});
                }
                room -= end - sl.n_done;
            }
        }
        return rows;
    }

    // A row's outcome: its slot moves on, takes the greedy token of a logits row (an
    // end-of-generation token ends the reply unkept), and is freed once done.
    void take(ReplySlot& sl, const ReplyRow& r, const float* logits, const Model& model, int32_t max_new) {
        sl.n_done = r.pos + 1;
        if (logits == nullptr) {
            if (sl.last) sl = ReplySlot{};
            return;
        }
        const llama_token t = argmax(logits, model.n_vocab());
        if (model.is_eog(t)) {
            sl = ReplySlot{};
            return;
        }
        auto& reply = out_[sl.prompt].reply;
        reply.push_back(t);
        sl.last = static_cast<int32_t>(reply.size()) == max_new;
    }

private:
    const std::vector<std::vector<llama_token>>& prompts_;
    std::vector<GeneratedSequence>& out_;
};

}  // namespace

void FeatureCapture::check_prompts(const std::vector<std::vector<llama_token>>& prompts, int32_t max_new) const {
    if (max_new < 1) throw InvalidArgument("max_new must be at least 1, got " + std::to_string(max_new));
    for (size_t i = 0; i < prompts.size(); ++i) {
        if (prompts[i].empty()) throw InvalidArgument("prompt " + std::to_string(i) + " is empty");
        if (static_cast<int64_t>(prompts[i].size()) + max_new > n_ctx_) {
            throw ContextLimitError("prompt " + std::to_string(i) + " (" + std::to_string(prompts[i].size()) +
                                    " tokens) and " + std::to_string(max_new) +
                                    " new tokens do not fit the capture context of " + std::to_string(n_ctx_) +
                                    " tokens per sequence");
        }
        for (llama_token t : prompts[i]) model_->check_token(t);
    }
}

std::vector<GeneratedSequence> FeatureCapture::generate(const std::vector<std::vector<llama_token>>& prompts,
                                                        int32_t max_new) {
    check_prompts(prompts, max_new);
    const auto n_embd = static_cast<size_t>(model_->n_embd());
    const size_t width = layer_ids_.size() * n_embd;
    llama_memory_t mem = llama_get_memory(ctx_.get());
    llama_memory_clear(mem, true);
    std::vector<GeneratedSequence> out(prompts.size());
    ReplyPlan plan(prompts, out);
    std::vector<ReplySlot> slots(static_cast<size_t>(n_seq_));
    size_t next = 0;
    llama_batch_ext* b = batch_.get();
    for (;;) {
        for (size_t s = 0; s < slots.size() && next < prompts.size(); ++s) {  // a free slot takes the next prompt
            if (slots[s].prompt != ReplySlot::kFree) continue;
            llama_memory_seq_rm(mem, static_cast<llama_seq_id>(s), -1, -1);
            slots[s] = ReplySlot{next, 0, false};
            out[next].features.resize((prompts[next].size() + static_cast<size_t>(max_new)) * width);
            ++next;
        }
        const std::vector<ReplyRow> rows = plan.rows(slots, std::max(n_batch_, n_seq_));
        if (rows.empty()) break;
        llama_batch_ext_clear(b);
        for (const ReplyRow& r : rows) {
            add_token(b, static_cast<llama_seq_id>(r.slot), plan.token_at(slots[r.slot].prompt, r.pos), r.pos,
                      r.logits);
        }
        take_thread_errors();
        const int32_t rc = llama_process(ctx_.get(), LLAMA_PROCESS_TYPE_DECODE, b);
        if (rc != 0) {
            llama_memory_clear(mem, true);
            throw DecodeError("feature capture pass failed (llama_process returned " + std::to_string(rc) + ")");
        }
        for (size_t k = 0; k < layer_ids_.size(); ++k) {
            const float* feats = llama_get_embeddings_layer_inp(ctx_.get(), static_cast<uint32_t>(layer_ids_[k]));
            if (feats == nullptr)
                throw DecodeError("llama.cpp returned no layer inputs for layer " + std::to_string(layer_ids_[k]));
            for (size_t i = 0; i < rows.size(); ++i) {
                // F16 as the cache keeps them: half the memory of a chunk of a large target
                ggml_fp16_t* dst = out[slots[rows[i].slot].prompt].features.data() +
                                   static_cast<size_t>(rows[i].pos) * width + k * n_embd;
                ggml_fp32_to_fp16_row(feats + i * n_embd, dst, static_cast<int64_t>(n_embd));
            }
        }
        for (size_t i = 0; i < rows.size(); ++i) {
            const float* logits = rows[i].logits ? llama_get_logits_ith(ctx_.get(), static_cast<int32_t>(i)) : nullptr;
            if (rows[i].logits && logits == nullptr) throw DecodeError("llama.cpp returned no logits for a reply row");
            plan.take(slots[rows[i].slot], rows[i], logits, *model_, max_new);
        }
    }
    for (size_t p = 0; p < out.size(); ++p) {
        out[p].features.resize(static_cast<size_t>(plan.n_total(p)) * width);
        out[p].features.shrink_to_fit();
    }
    llama_memory_clear(mem, true);
    return out;
}

}  // namespace pydflash
