#include "drafter.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "errors.h"
#include "llama-ext.h"

namespace pydflash {
namespace {

std::string meta(const Model& m, const std::string& key, const std::string& fallback) {
    const auto& md = m.info().metadata;
    const auto it = md.find(key);
    return it == md.end() ? fallback : it->second;
}

void check_drafter_header(const GgufInfo& info, const std::string& path) {
    auto fail = [&](const std::string& why) { throw DraftCompatibilityError(path + ": " + why); };
    if (info.architecture != "dflash") {
        fail("drafter architecture is '" + info.architecture +
             "', expected 'dflash' (a DFlash drafter converted with llama.cpp's converter)");
    }
    if (info.has_tensor("markov_w1.weight")) {
        fail("this is a DSpark drafter (Markov head); pydflash supports DFlash drafters only");
    }
    if (info.has_tensor("selector_hidden.weight") || info.metadata.count("dflash.selector_top_k")) {
        fail("this is a DFlash2 drafter (selector lattice); pydflash supports DFlash drafters only");
    }
    if (info.has_tensor("d2t")) {
        fail("reduced-vocabulary drafters (d2t) are not supported");
    }
}

}  // namespace

std::shared_ptr<Model> load_drafter(const std::string& path, const ModelParams& params) {
    if (path.empty()) throw InvalidArgument("drafter path is empty");
    GgufInfo info = inspect_gguf(path);
    if (info.architecture != "dflash-draft") check_drafter_header(info, path);  // old format: load() words it
    return Model::load(path, params, "drafter");
}

bool target_exposes_layer_inputs(const std::string& arch) {
    // Model graphs in this llama.cpp tree that record res->t_layer_inp[il].
    static const std::set<std::string> kArchs = {
        "llama",  "qwen3", "qwen3moe",   "qwen3next",  "qwen35", "qwen35moe",   "gpt-oss",
        "gemma4", "lfm2",  "minimax-m2", "nemotron_h", "mimo2",  "bailingmoe3",
    };
    return kArchs.count(arch) > 0;
}

DraftSpec check_drafter(const Model& target, const Model& drafter) {
    const std::string who = drafter.path() + ": ";
    auto fail = [&](const std::string& why) { throw DraftCompatibilityError(who + why); };

    check_drafter_header(drafter.info(), drafter.path());
    // recurrent/hybrid targets are fine here: the context pair picks their
    // rollback (state planes or checkpoints) when it creates the target context
    if (!target_exposes_layer_inputs(target.architecture())) {
        fail("target architecture '" + target.architecture() +
             "' does not expose layer inputs in llama.cpp, so DFlash cannot read its features");
    }
    if (drafter.n_embd() != target.n_embd()) {
        fail("drafter hidden size " + std::to_string(drafter.n_embd()) + " differs from the target's " +
             std::to_string(target.n_embd()));
    }
    if (drafter.n_vocab() != target.n_vocab()) {
        fail("drafter vocabulary size " + std::to_string(drafter.n_vocab()) + " differs from the target's " +
             std::to_string(target.n_vocab()));
    }

    DraftSpec spec;
    spec.n_embd_target = target.n_embd();
    const uint32_t n_ids = llama_model_target_layer_ids_n(drafter.get());
    const int32_t* ids = llama_model_target_layer_ids(drafter.get());
    if (n_ids == 0 || ids == nullptr) fail("drafter has no target layer ids (dflash.target_layers)");
    for (uint32_t k = 0; k < n_ids; ++k) {
        // the graph records inputs of layers 0 .. n_layer-1 only
        if (ids[k] < 0 || ids[k] >= target.n_layer()) {
            fail("target layer id " + std::to_string(ids[k]) + " is out of range: the target has " +
                 std::to_string(target.n_layer()) + " layers (valid ids 0.." + std::to_string(target.n_layer() - 1) +
                 ")");
        }
        spec.target_layer_ids.push_back(ids[k]);
    }
    spec.mask_token = llama_vocab_mask(drafter.vocab());
    if (spec.mask_token < 0 || spec.mask_token >= drafter.n_vocab()) {
        fail("drafter vocabulary has no mask token (tokenizer.ggml.mask_token_id)");
    }
    // parsed wide: a uint32 past INT_MAX must be reported as written, not wrapped
    const std::string block = meta(drafter, "dflash.block_size", "16");
    const long long block_size = std::strtoll(block.c_str(), nullptr, 10);
    if (block_size < 2 || block_size > 256) fail("dflash.block_size " + block + " is out of range [2, 256]");
    spec.block_size = static_cast<int>(block_size);
    spec.causal = meta(drafter, "dflash.attention.causal", "false") == "true";
    return spec;
}

std::string drafter_incompatibility(const Model& target, const Model& drafter) {
    try {
        check_drafter(target, drafter);
    } catch (const DraftCompatibilityError& e) {
        return e.what();
    }
    return {};
}

}  // namespace pydflash
