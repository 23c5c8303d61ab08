// Feature injection: the target's layer features of each kept position go into
// the drafter's cache (its K/V of that position), which the drafter's next
// block attends to. A step that does not use the drafter (plain decoding, an
// n-gram or external draft) defers its rows: their features wait in the
// sequence and are injected in one pass just before the drafter next drafts
// for it. Features are per position, so this gives the drafter the same cache
// as injecting every step; a run of plain steps then costs what the target
// alone costs instead of one small drafter pass each. A prompt defers its rows
// too where the engine expects its generation not to draft (prefill_begin's
// `defer`): one that ends without drafting costs its drafter nothing.
#include <algorithm>
#include <cstring>

#include "dflash_drafter.h"
#include "errors.h"
#include "llama-ext.h"

namespace pydflash {

size_t DFlashDrafter::feature_width() const {
    return spec_.target_layer_ids.size() * static_cast<size_t>(spec_.n_embd_target);
}

std::vector<const float*> DFlashDrafter::target_features() {
    std::vector<const float*> layers;
    for (int32_t id : spec_.target_layer_ids) {
        layers.push_back(llama_get_embeddings_layer_inp(target_, static_cast<uint32_t>(id)));
        if (layers.back() == nullptr) fail_.fail_decode("reading target layer features", -1);
    }
    return layers;
}

namespace {

// one row's features, layer after layer, as the drafter's fc reads them
void pack_row(const std::vector<const float*>& layers, size_t n_embd, size_t row, float* dst) {
    for (size_t k = 0; k < layers.size(); ++k) {
        std::memcpy(dst + k * n_embd, layers[k] + row * n_embd, n_embd * sizeof(float));
    }
}

}  // namespace

void DFlashDrafter::inject(const std::vector<Span>& spans) {
    // the spans' rows of the last target pass
    const std::vector<const float*> layers = target_features();
    const auto n_embd = static_cast<size_t>(spec_.n_embd_target);
    inject_rows(spans,
                [&](size_t, int32_t row, float* dst) { pack_row(layers, n_embd, static_cast<size_t>(row), dst); });
}

void DFlashDrafter::inject_rows(const std::vector<Span>& spans,
                                const std::function<void(size_t, int32_t, float*)>& fill) {
    // into the drafter's cache at the spans' positions, in passes of at most n_ubatch rows
    const size_t n_enc = feature_width();
    const auto chunk_max = static_cast<int32_t>(llama_n_ubatch(ctx_.get()));
    llama_batch_ext* b = batch_.get();
    int32_t n_chunk = 0;
    auto flush = [&]() {
        if (n_chunk == 0) return;
        const int32_t rc =
            fault_.fire(FaultSite::DrafterDecode) ? -1 : llama_process(ctx_.get(), LLAMA_PROCESS_TYPE_DECODE, b);
        if (rc != 0) fail_.fail_decode("drafter feature injection", rc);
        n_chunk = 0;
    };
    features_.resize(static_cast<size_t>(chunk_max) * n_enc);
    const std::vector<llama_pos> first = trim_window(spans);  // positions the drafter's window keeps
    for (size_t j = 0; j < spans.size(); ++j) {
        const Span& sp = spans[j];
        for (int32_t i = first[j] - sp.pos0; i < sp.n; ++i) {
            if (n_chunk == 0) llama_batch_ext_clear(b);
            float* dst = features_.data() + static_cast<size_t>(n_chunk) * n_enc;
            fill(j, sp.row0 + i, dst);
            const llama_embd e{dst, 1, n_enc};
            const int32_t idx = llama_batch_ext_add_embd(b, sp.seq, e);
            if (idx < 0) fail_.fail_decode("building the feature batch", idx);
            const llama_pos p = sp.pos0 + i;
            const llama_pos p4[4] = {p, p, p, 0};  // M-RoPE drafters read 4 positions per embedding
            if (!llama_batch_ext_set_pos(b, idx, p4)) fail_.fail_decode("setting feature positions", -1);
            if (++n_chunk == chunk_max) flush();
        }
    }
    flush();
}

int32_t DFlashDrafter::max_deferred() const {
    // Rows that wait until the sequence drafts again are never injected when it does
    // not (its generation ends off, a new prompt cuts them): the more a sequence
    // defers, the less a pair whose drafting does not pay spends on its drafter
    const size_t by_bytes = kDeferredBytes / (feature_width() * sizeof(float));
    const auto ubatch = static_cast<size_t>(llama_n_ubatch(ctx_.get()));
    return static_cast<int32_t>(std::max(std::min(by_bytes, ubatch), static_cast<size_t>(kMinDeferred)));
}

void DFlashDrafter::defer(const std::vector<Span>& spans) {
    const std::vector<const float*> layers = target_features();
    const auto n_embd = static_cast<size_t>(spec_.n_embd_target);
    const size_t n_enc = feature_width();
    std::vector<int32_t> full;
    for (const Span& sp : spans) {
        Deferred& d = deferred_[static_cast<size_t>(sp.seq)];
        if (d.n > 0 && d.pos0 + d.n != sp.pos0) flush_deferred({sp.seq});  // not contiguous
        if (d.n == 0) d.pos0 = sp.pos0;
        d.rows.resize((static_cast<size_t>(d.n) + static_cast<size_t>(sp.n)) * n_enc);
        for (int32_t i = 0; i < sp.n; ++i) {
            pack_row(layers, n_embd, static_cast<size_t>(sp.row0 + i),
                     d.rows.data() + static_cast<size_t>(d.n + i) * n_enc);
        }
        d.n += sp.n;
        // bounded: a long run of plain steps is injected in passes of max_deferred_ rows
        if (d.n >= max_deferred_) full.push_back(sp.seq);
    }
    if (!full.empty()) flush_deferred(full);
}

void DFlashDrafter::flush_deferred(const std::vector<int32_t>& seqs) {
    std::vector<Span> spans;
    std::vector<const Deferred*> from;
    for (int32_t seq : seqs) {
        const Deferred& d = deferred_[static_cast<size_t>(seq)];
        if (d.n == 0) continue;
        spans.push_back({seq, 0, d.n, d.pos0});
        from.push_back(&d);
    }
    if (spans.empty()) return;
    const size_t n_enc = feature_width();
    inject_rows(spans, [&](size_t j, int32_t row, float* dst) {
        std::memcpy(dst, from[j]->rows.data() + static_cast<size_t>(row) * n_enc, n_enc * sizeof(float));
    });
    for (int32_t seq : seqs) deferred_[static_cast<size_t>(seq)].drop();
}

void DFlashDrafter::cut_deferred(Deferred& d, llama_pos end) {
    // positions >= end leave (a prompt-cache cut)
    const int32_t keep = std::clamp(end - d.pos0, 0, d.n);
    d.n = keep;
    d.rows.resize(static_cast<size_t>(keep) * feature_width());
    if (keep == 0) d.drop();
}

llama_pos DFlashDrafter::keep_prefix(int32_t seq, llama_pos common, bool defer) {
    Deferred& d = deferred_[static_cast<size_t>(seq)];
    cut_deferred(d, common);
    if (!defer) flush_deferred({seq});
    // the drafter's cache must end where the prompt's rows start, or where the
    // deferred rows the prompt's will follow start
    return d.n > 0 ? d.pos0 : common;
}

}  // namespace pydflash
