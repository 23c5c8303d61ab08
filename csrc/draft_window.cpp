// The drafter's context window: its attention and KV cache hold the target
// features of the last `window` positions of each sequence only, so its memory
// and its per-block attention cost stay flat as the context grows; the target
// is untouched (a window changes what the drafter sees, never the output).
//
// Two sources: the drafter's own sliding window (llama.cpp's `dflash` loader
// reads dflash.attention.sliding_window + its per-layer pattern and masks in
// the graph; with swa_full off its SWA cache is window-sized), and the pair's
// `draft_window`, a ring kept here: before features of positions [a, b) are
// injected, positions below b - window leave the drafter's cache and only
// positions >= b - window are injected, so a sequence's drafter memory is one
// contiguous tail (llama.cpp's batch checks want Y = X + 1, or an empty
// sequence). The block drafted at position p then attends to the features of
// [p - window, p).
#include <algorithm>
#include <map>
#include <string>

#include "dflash_drafter.h"
#include "errors.h"

namespace pydflash {

DFlashDrafter::Window DFlashDrafter::plan_window(const DraftSpec& spec, const PairParams& params) {
    const int32_t want = params.draft_window;  // validated: >= -1
    const int32_t own = spec.n_swa;
    if (want > 0 && want < spec.block_size) {
        throw InvalidArgument("draft_window=" + std::to_string(want) + " is smaller than the drafter's block of " +
                              std::to_string(spec.block_size) + " tokens; use at least " +
                              std::to_string(spec.block_size) + ", or 0 for the whole context");
    }
    if (want > 0 && own > 0 && want > own) {
        throw InvalidArgument("draft_window=" + std::to_string(want) + " is wider than this drafter's own sliding " +
                              "window of " + std::to_string(own) + " (it was trained on that window); use at most " +
                              std::to_string(own) + ", or leave draft_window unset");
    }
    // by default the drafter's own window, else ours; one as wide as a sequence's
    // context never drops anything: no ring
    const int32_t ring = want >= 0 ? want : (own > 0 ? 0 : kDefaultDraftWindow);
    Window w;
    w.ring = ring > 0 && ring < params.n_ctx / params.n_seq ? ring : 0;
    w.view = w.ring > 0 ? w.ring : own;
    return w;
}

uint32_t DFlashDrafter::drafter_n_ctx(uint32_t full) const {
    if (window_ == 0) return full;
    // a sequence holds at most the window plus one block (noise rows, removed after the draft)
    const int64_t per_seq = static_cast<int64_t>(window_) + spec_.lead_rows() + spec_.block_size;
    return static_cast<uint32_t>(std::min<int64_t>(full, per_seq * params_.n_seq));
}

std::vector<llama_pos> DFlashDrafter::trim_window(const std::vector<Span>& spans) {
    std::vector<llama_pos> first(spans.size());
    for (size_t i = 0; i < spans.size(); ++i) first[i] = spans[i].pos0;
    if (window_ == 0) return first;
    std::map<int32_t, llama_pos> end;  // per sequence: the position after its last injected row
    for (const Span& sp : spans) end[sp.seq] = std::max(end[sp.seq], sp.pos0 + sp.n);
    llama_memory_t mem = llama_get_memory(ctx_.get());
    for (const auto& [seq, e] : end) {
        const llama_pos from = e - window_;
        // removing a sequence's oldest positions cannot fail in a KV cache
        if (from > 0 && !llama_memory_seq_rm(mem, seq, 0, from)) fail_.fail_decode("trimming the drafter's window", -1);
    }
    for (size_t i = 0; i < spans.size(); ++i) first[i] = std::max(first[i], end[spans[i].seq] - window_);
    return first;
}

bool DFlashDrafter::cut(int32_t seq, int32_t common) {
    // The target keeps its whole common prefix. The drafter's sequence must then end at
    // common - 1 or be empty (llama.cpp's batch check): a window may have dropped the
    // positions just below the cut, and a sliding-window cache may keep stray older
    // cells, so it starts over there and sees less context until its window refills
    // (fewer drafts kept for a while, never another output; re-evaluating up to a
    // window of target tokens instead would cost more than it saves).
    llama_memory_t mem = llama_get_memory(ctx_.get());
    if (!llama_memory_seq_rm(mem, seq, common, -1)) return false;
    const llama_pos last = llama_memory_seq_pos_max(mem, seq);
    if (last >= 0 && last != common - 1) llama_memory_seq_rm(mem, seq, -1, -1);
    return true;
}

}  // namespace pydflash
