#include "drafter.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>

#include "errors.h"
#include "ggml.h"
#include "gguf.h"
#include "handles.h"
#include "llama-ext.h"

namespace pydflash {
namespace {

std::string meta(const Model& m, const std::string& key, const std::string& fallback) {
    const auto& md = m.info().metadata;
    const auto it = md.find(key);
    return it == md.end() ? fallback : it->second;
}

// a metadata integer; `fallback` when absent, -1 when it is not a number
long long meta_int(const GgufInfo& info, const std::string& key, long long fallback) {
    const auto it = info.metadata.find(key);
    if (it == info.metadata.end()) return fallback;
    char* end = nullptr;
    const long long v = std::strtoll(it->second.c_str(), &end, 10);
    return end == it->second.c_str() ? -1 : v;
}

struct GgmlCtxDeleter {
    void operator()(ggml_context* c) const noexcept { ggml_free(c); }
};

// The GGUF's tensor table (shapes and types, no data) and its tokenizer size.
struct TensorTable {
    GgufPtr g;
    std::unique_ptr<ggml_context, GgmlCtxDeleter> ctx;
    const ggml_tensor* get(const char* name) const { return ggml_get_tensor(ctx.get(), name); }
    int64_t n_vocab() const {
        const int64_t k = gguf_find_key(g.get(), "tokenizer.ggml.tokens");
        return k < 0 ? 0 : static_cast<int64_t>(gguf_get_arr_n(g.get(), k));
    }
};

TensorTable open_table(const std::string& path) {
    ggml_context* ctx = nullptr;
    gguf_init_params gp{};
    gp.no_alloc = true;
    gp.ctx = &ctx;
    TensorTable t;
    t.g.reset(gguf_init_from_file(path.c_str(), gp));
    t.ctx.reset(ctx);
    if (!t.g || !t.ctx) throw ModelLoadError(path + ": corrupt or truncated GGUF header");
    return t;
}

// d2t maps drafter rows to target ids: llama.cpp scatters with it, so every id
// must be an absolute target id, in range and used once
void check_d2t(const TensorTable& t, const ggml_tensor* d2t, int64_t n_vocab, int64_t n_embd, const std::string& path,
               DraftSpec& spec) {
    auto fail = [&](const std::string& why) { throw DraftCompatibilityError(path + ": " + why); };
    if (d2t->type != GGML_TYPE_I64) {
        fail(std::string("d2t has type ") + ggml_type_name(d2t->type) +
             ", expected I64 absolute target token ids (re-convert with llama.cpp's converter)");
    }
    const int64_t nv = d2t->ne[0];
    if (ggml_n_dims(d2t) != 1 || nv < 1 || nv > n_vocab) {
        fail("d2t has " + std::to_string(nv) + " entries; a reduced vocabulary has 1.." + std::to_string(n_vocab));
    }
    const ggml_tensor* head = t.get("output.weight");
    if (head == nullptr || head->ne[0] != n_embd || head->ne[1] != nv) {
        fail("a reduced-vocabulary (d2t) drafter needs its own output head output.weight of shape {" +
             std::to_string(n_embd) + ", " + std::to_string(nv) + "} (one row per d2t entry)");
    }
    std::vector<int64_t> ids(static_cast<size_t>(nv));
    const int64_t id = gguf_find_tensor(t.g.get(), "d2t");
    std::ifstream f(path, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(gguf_get_data_offset(t.g.get()) + gguf_get_tensor_offset(t.g.get(), id)));
    f.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(ids.size() * sizeof(int64_t)));
    if (!f) fail("d2t's data is truncated");
    std::vector<bool> seen(static_cast<size_t>(n_vocab), false);
    for (int64_t v : ids) {
        if (v < 0 || v >= n_vocab) {
            fail("d2t holds id " + std::to_string(v) + ", outside the vocabulary [0, " + std::to_string(n_vocab) +
                 "): it must hold absolute target ids (re-convert with llama.cpp's converter)");
        }
        if (seen[static_cast<size_t>(v)]) {
            fail("d2t holds id " + std::to_string(v) +
                 " twice: it looks like offsets (target = i + d2t[i]), not the absolute target ids llama.cpp "
                 "expects (re-convert with llama.cpp's converter)");
        }
        seen[static_cast<size_t>(v)] = true;
    }
    spec.n_vocab_draft = static_cast<int32_t>(nv);
}

void check_dflash2(const GgufInfo& info, const TensorTable& t, int64_t n_embd, const std::string& path,
                   DraftSpec& spec) {
    auto fail = [&](const std::string& why) { throw DraftCompatibilityError(path + ": DFlash2 drafter: " + why); };
    if (t.get("selector_hidden.weight") == nullptr) {
        fail("dflash.selector_top_k is set but the selector tensors (selector_hidden.weight, ...) are missing");
    }
    for (const char* key : {"selector_top_k", "selector_rank", "conv_kernel_size", "conv_group_size", "block_size"}) {
        if (meta_int(info, std::string("dflash.") + key, 0) <= 0) {
            fail(std::string("metadata dflash.") + key + " is missing or not positive");
        }
    }
    const long long k = meta_int(info, "dflash.selector_top_k", 0);
    const long long group = meta_int(info, "dflash.conv_group_size", 0);
    if (n_embd % group != 0) {
        fail("hidden size " + std::to_string(n_embd) + " is not a multiple of dflash.conv_group_size " +
             std::to_string(group));
    }
    if (n_embd < k * (k + 1)) {
        fail("hidden size " + std::to_string(n_embd) + " is smaller than the selector lattice row k(k+1) = " +
             std::to_string(k * (k + 1)) + " (dflash.selector_top_k " + std::to_string(k) + ")");
    }
    const int64_t n_vocab = t.n_vocab();
    if (k > n_vocab) fail("dflash.selector_top_k " + std::to_string(k) + " exceeds the vocabulary");
    if (n_vocab > (1 << 24)) fail("the lattice carries token ids as floats: vocabularies over 2^24 lose ids");
    spec.kind = DrafterKind::DFlash2;
    spec.selector_top_k = static_cast<int32_t>(k);
}

void check_dspark(const GgufInfo& info, const TensorTable& t, const std::string& path, DraftSpec& spec) {
    auto fail = [&](const std::string& why) { throw DraftCompatibilityError(path + ": DSpark drafter: " + why); };
    if (spec.kind == DrafterKind::DFlash2) fail("it has both a DFlash2 selector and a DSpark Markov head");
    if (t.get("markov_w2.weight") == nullptr) fail("markov_w1.weight is present but markov_w2.weight is missing");
    // llama.cpp's Markov head reads the key itself and asserts it is there
    if (meta_int(info, "dflash.block_size", 0) <= 0) fail("metadata dflash.block_size is missing");
    const auto anchor = info.metadata.find("dflash.sample_from_anchor");
    spec.kind = DrafterKind::DSpark;
    spec.anchor_first = anchor == info.metadata.end() || anchor->second == "true";
    spec.confidence_head = t.get("conf_proj.weight") != nullptr;
}

// The kind and what it needs, from the header (no weights loaded).
DraftSpec read_drafter_header(const GgufInfo& info, const std::string& path) {
    auto fail = [&](const std::string& why) { throw DraftCompatibilityError(path + ": " + why); };
    if (info.architecture != "dflash") {
        fail("drafter architecture is '" + info.architecture +
             "', expected 'dflash' (a DFlash, DFlash2 or DSpark drafter converted with llama.cpp's converter)");
    }
    if (info.metadata.count("dflash.hyper_connection_count")) {
        fail(
            "DeepSeek-V4 DSpark drafters (dflash.hyper_connection_count) are not supported: their graph drafts for "
            "a deepseek4 target, which pydflash cannot read features from");
    }
    DraftSpec spec;
    const TensorTable t = open_table(path);
    const long long n_embd = meta_int(info, "dflash.embedding_length", 0);
    if (n_embd <= 0) return spec;  // llama.cpp's loader names the missing key
    if (t.get("selector_hidden.weight") != nullptr || meta_int(info, "dflash.selector_top_k", 0) != 0) {
        check_dflash2(info, t, n_embd, path, spec);
    }
    if (t.get("markov_w1.weight") != nullptr) check_dspark(info, t, path, spec);
    if (const ggml_tensor* d2t = t.get("d2t")) check_d2t(t, d2t, t.n_vocab(), n_embd, path, spec);
    return spec;
}

}  // namespace

const char* drafter_kind_name(DrafterKind kind) {
    switch (kind) {
        case DrafterKind::DFlash2: return "dflash2";
        case DrafterKind::DSpark: return "dspark";
        default: return "dflash";
    }
}

std::string DraftSpec::describe() const {
    std::string s = drafter_kind_name(kind);
    std::string notes;
    auto note = [&notes](const std::string& n) { notes += (notes.empty() ? "" : ", ") + n; };
    if (kind == DrafterKind::DFlash2) note("selector top-k " + std::to_string(selector_top_k));
    if (kind == DrafterKind::DSpark) {
        note(anchor_first ? "anchor-first" : "bonus anchor");
        note(confidence_head ? "confidence head" : "no confidence head");
    }
    if (n_vocab_draft > 0) note("d2t vocabulary " + std::to_string(n_vocab_draft));
    return notes.empty() ? s : s + " (" + notes + ")";
}

std::shared_ptr<Model> load_drafter(const std::string& path, const ModelParams& params) {
    if (path.empty()) throw InvalidArgument("drafter path is empty");
    GgufInfo info = inspect_gguf(path);
    if (info.architecture != "dflash-draft") read_drafter_header(info, path);  // old format: load() words it
    return Model::load(path, params, "drafter");
}

std::string drafter_description(const Model& drafter) {
    if (drafter.architecture() != "dflash") return {};
    try {
        return read_drafter_header(drafter.info(), drafter.path()).describe();
    } catch (const Error&) {
        return {};
    }
}

const std::set<std::string>& layer_input_architectures() {
    // Model graphs that record res->t_layer_inp[il]: upstream's, then those that
    // tools/patch_llama_cpp.py adds (its LAYER_INPUT_GRAPHS; a test keeps the two equal)
    static const std::set<std::string> kArchs = {
        "llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "gpt-oss", "gemma4", "lfm2", "minimax-m2",
        "nemotron_h", "mimo2", "bailingmoe3", "deepseek4", "hunyuan_vl", "minimax-01", "muse-glimmer", "nanbeige",
        "qwen4exp",
        // patched
        "qwen2", "qwen2moe", "gemma2", "gemma3", "phi3", "smollm3", "mistral3", "olmo2", "starcoder2", "exaone",
        "exaone4", "internlm2", "glm4", "apertus", "arcee", "seed_oss", "ernie4_5"};
    return kArchs;
}

bool target_exposes_layer_inputs(const std::string& arch) { return layer_input_architectures().count(arch) > 0; }

DraftSpec check_drafter(const Model& target, const Model& drafter) {
    const std::string who = drafter.path() + ": ";
    auto fail = [&](const std::string& why) { throw DraftCompatibilityError(who + why); };

    DraftSpec spec = read_drafter_header(drafter.info(), drafter.path());
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

    spec.n_embd_target = target.n_embd();
    spec.n_embd_draft = llama_model_n_embd_out(drafter.get());
    spec.n_swa = std::max(0, llama_model_n_swa(drafter.get()));
    if (spec.kind != DrafterKind::DFlash && spec.n_embd_draft != drafter.n_embd()) {
        // the lattice / confidence rows are n_embd wide; llama.cpp copies n_embd_out per row
        fail(std::string(drafter_kind_name(spec.kind)) + " drafter's output width " +
             std::to_string(spec.n_embd_draft) + " differs from its hidden size " + std::to_string(drafter.n_embd()));
    }
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
