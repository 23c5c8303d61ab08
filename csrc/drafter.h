// What a DFlash drafter needs from its target, checked once at load time,
// before any decode: every mismatch that would make llama.cpp abort or draft
// garbage becomes a DraftCompatibilityError here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

namespace pydflash {

struct DraftSpec {
    int32_t block_size = 16;  // trained block: [last, mask x (block_size - 1)]
    llama_token mask_token = -1;
    std::vector<int32_t> target_layer_ids;  // inputs of these target layers are the features
    bool causal = false;                    // block-internal attention (false for DFlash)
    int32_t n_embd_target = 0;
    int32_t max_draft() const { return block_size - 1; }
};

// Target architectures whose llama.cpp graph exposes layer inputs (needed for
// feature extraction); others would abort inside llama.cpp.
bool target_exposes_layer_inputs(const std::string& architecture);

// Load a drafter: its GGUF header is checked first (architecture, DFlash2 /
// DSpark / reduced-vocab variants), so a wrong file fails before any weights load.
std::shared_ptr<Model> load_drafter(const std::string& path, const ModelParams& params);

// Throws DraftCompatibilityError with the drafter's path and the reason.
DraftSpec check_drafter(const Model& target, const Model& drafter);

// Non-throwing variant for `pydflash info`: the empty string means compatible.
std::string drafter_incompatibility(const Model& target, const Model& drafter);

}  // namespace pydflash
