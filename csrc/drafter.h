// What a drafter needs from its target, checked once at load time, before any
// decode: every mismatch that would make llama.cpp abort or draft garbage
// becomes a DraftCompatibilityError here.
//
// Three kinds share llama.cpp's `dflash` architecture (src/models/dflash.cpp
// computes each kind's extras in-graph; the host reads them as
// common/speculative.cpp does):
// - DFlash:  [pending, mask x n] in one non-causal pass; logits at rows 1..n.
// - DFlash2: the same block; the graph packs a selector lattice per row into its
//            nextn output ([k ids | k x k scores | pad]) and the host walks it
//            greedily: tokens only, no distribution.
// - DSpark:  DFlash + a Markov head (biased logits) and an optional confidence
//            head (nextn output); anchor-first files read from row 0.
// Any of them may carry `d2t` (a reduced drafter vocabulary whose logits the
// graph scatters into the full one): transparent to the host.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "model.h"

namespace pydflash {

enum class DrafterKind { DFlash, DFlash2, DSpark };

const char* drafter_kind_name(DrafterKind kind);

struct DraftSpec {
    DrafterKind kind = DrafterKind::DFlash;
    int32_t block_size = 16;  // trained block: [last, mask x (block_size - 1)]
    llama_token mask_token = -1;
    std::vector<int32_t> target_layer_ids;  // inputs of these target layers are the features
    bool causal = false;                    // block-internal attention (false for DFlash)
    int32_t n_embd_target = 0;
    int32_t n_embd_draft = 0;      // width of a nextn row (DFlash2 lattice, DSpark confidence)
    int32_t selector_top_k = 0;    // DFlash2: candidates per position
    bool anchor_first = false;     // DSpark sample_from_anchor: block [last, mask x (n - 1)], read from row 0
    bool confidence_head = false;  // DSpark: a confidence per position (draft_p_min cuts on it)
    int32_t n_vocab_draft = 0;     // > 0: reduced drafter vocabulary (d2t)
    int32_t n_swa = 0;             // > 0: the drafter's own sliding window (dflash.attention.sliding_window)

    // drafted tokens per block: anchor-first DSpark predicts from the anchor row too
    int32_t max_draft() const { return anchor_first ? block_size : block_size - 1; }
    // rows of the block before the first drafted one
    int32_t lead_rows() const { return anchor_first ? 0 : 1; }
    // the DFlash2 / DSpark graphs slice a pass into equal blocks (GGML_ASSERT otherwise)
    bool equal_blocks() const { return kind != DrafterKind::DFlash; }
    // "dflash2 (selector top-k 4), d2t vocabulary 200" for `pydflash info`
    std::string describe() const;
};

// Target architectures whose llama.cpp graph exposes layer inputs (needed for
// feature extraction); others would abort inside llama.cpp.
bool target_exposes_layer_inputs(const std::string& architecture);
const std::set<std::string>& layer_input_architectures();  // the architectures above

// Load a drafter: its GGUF header is checked first (architecture, the kind and
// what the kind needs), so a wrong file fails before any weights load.
std::shared_ptr<Model> load_drafter(const std::string& path, const ModelParams& params);

// Throws DraftCompatibilityError with the drafter's path and the reason.
DraftSpec check_drafter(const Model& target, const Model& drafter);

// Non-throwing variant for `pydflash info`: the empty string means compatible.
std::string drafter_incompatibility(const Model& target, const Model& drafter);

// The kind and variant of a loaded drafter ("dflash2 (selector top-k 4)"), from
// its header alone; "" for a model that is not a `dflash` drafter.
std::string drafter_description(const Model& drafter);

}  // namespace pydflash
