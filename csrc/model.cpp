#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <unordered_set>

#include "backend.h"
#include "devices.h"
#include "errors.h"
#include "options.h"

namespace fs = std::filesystem;

namespace pydflash {
namespace {

std::string gguf_value_text(const gguf_context* g, int64_t i) {
    switch (gguf_get_kv_type(g, i)) {
        case GGUF_TYPE_UINT8: return std::to_string(gguf_get_val_u8(g, i));
        case GGUF_TYPE_INT8: return std::to_string(gguf_get_val_i8(g, i));
        case GGUF_TYPE_UINT16: return std::to_string(gguf_get_val_u16(g, i));
        case GGUF_TYPE_INT16: return std::to_string(gguf_get_val_i16(g, i));
        case GGUF_TYPE_UINT32: return std::to_string(gguf_get_val_u32(g, i));
        case GGUF_TYPE_INT32: return std::to_string(gguf_get_val_i32(g, i));
        case GGUF_TYPE_UINT64: return std::to_string(gguf_get_val_u64(g, i));
        case GGUF_TYPE_INT64: return std::to_string(gguf_get_val_i64(g, i));
        case GGUF_TYPE_FLOAT32: {
            char buf[64];
            std::snprintf(buf, sizeof(buf), "%g", gguf_get_val_f32(g, i));
            return buf;
        }
        case GGUF_TYPE_FLOAT64: {
            char buf[64];
            std::snprintf(buf, sizeof(buf), "%g", gguf_get_val_f64(g, i));
            return buf;
        }
        case GGUF_TYPE_BOOL: return gguf_get_val_bool(g, i) ? "true" : "false";
        case GGUF_TYPE_STRING: return gguf_get_val_str(g, i);
        case GGUF_TYPE_ARRAY: {
            const auto at = gguf_get_arr_type(g, i);
            const size_t n = gguf_get_arr_n(g, i);
            if ((at == GGUF_TYPE_INT32 || at == GGUF_TYPE_UINT32) && n <= 64) {
                const auto* data = static_cast<const int32_t*>(gguf_get_arr_data(g, i));
                std::string s = "[";
                for (size_t k = 0; k < n; ++k) {
                    if (k) s += ", ";
                    s += at == GGUF_TYPE_INT32 ? std::to_string(data[k])
                                               : std::to_string(static_cast<uint32_t>(data[k]));
                }
                return s + "]";
            }
            return "[" + std::string(gguf_type_name(at)) + " x " + std::to_string(n) + "]";
        }
        default: return "?";
    }
}

std::string load_failure_reason(const std::string& logged) {
    if (logged.empty()) return "llama.cpp could not load it";
    // keep the most specific line llama.cpp printed
    std::string reason = logged;
    const auto pos = reason.find("error loading model: ");
    if (pos != std::string::npos) {
        reason = reason.substr(pos + std::strlen("error loading model: "));
        const auto nl = reason.find('\n');
        if (nl != std::string::npos) reason = reason.substr(0, nl);
    }
    return reason;
}

// Checks for values on which llama.cpp's loader asserts (aborting the process)
// instead of failing: found by the crafted corpus in tests/data/bad_gguf.
void validate_header(const gguf_context* g, const GgufInfo& info, const std::string& path) {
    const std::string key = info.architecture + ".block_count";
    const int64_t kid = gguf_find_key(g, key.c_str());
    if (kid >= 0) {
        const auto t = gguf_get_kv_type(g, kid);
        int64_t n = -1;
        if (t == GGUF_TYPE_UINT32)
            n = gguf_get_val_u32(g, kid);
        else if (t == GGUF_TYPE_INT32)
            n = gguf_get_val_i32(g, kid);
        else if (t == GGUF_TYPE_UINT64)
            n = static_cast<int64_t>(std::min<uint64_t>(gguf_get_val_u64(g, kid), INT64_MAX));
        if (n < 1 || n > 512) {
            throw ModelLoadError(path + ": " + key + " must be an integer in [1, 512] (llama.cpp's layer limit), got " +
                                 info.metadata.at(key));
        }
    }
    // rope sections (M-RoPE/IMRoPE targets, and DFlash drafters of them): ggml's
    // rope kernel divides by their sum and asserts it is at most the rotated
    // dimensions, in the decode; llama.cpp itself refuses other lengths than 4
    const std::string skey = info.architecture + ".rope.dimension_sections";
    const int64_t sid = gguf_find_key(g, skey.c_str());
    if (sid >= 0 && gguf_get_kv_type(g, sid) == GGUF_TYPE_ARRAY && gguf_get_arr_n(g, sid) == 4 &&
        (gguf_get_arr_type(g, sid) == GGUF_TYPE_INT32 || gguf_get_arr_type(g, sid) == GGUF_TYPE_UINT32)) {
        const auto* sec = static_cast<const int32_t*>(gguf_get_arr_data(g, sid));  // llama.cpp reads them as int
        int64_t sum = 0;
        bool negative = false;
        for (int k = 0; k < 4; ++k) {
            negative = negative || sec[k] < 0;
            sum += sec[k];
        }
        auto meta_int = [&](const std::string& k) -> int64_t {
            const auto it = info.metadata.find(info.architecture + "." + k);
            return it == info.metadata.end() ? -1 : std::strtoll(it->second.c_str(), nullptr, 10);
        };
        int64_t n_rot = meta_int("rope.dimension_count");
        if (n_rot < 0) n_rot = meta_int("attention.key_length");
        if (n_rot < 0) {
            const int64_t n_embd = meta_int("embedding_length"), n_head = meta_int("attention.head_count");
            if (n_embd > 0 && n_head > 0) n_rot = n_embd / n_head;
        }
        // all zero: no sections (a DFlash drafter then uses plain NeoX RoPE)
        const bool none = sum == 0 && !negative && info.architecture == "dflash";
        if (!none && (negative || sum <= 0 || (n_rot > 0 && sum > n_rot))) {
            throw ModelLoadError(path + ": " + skey + " " + info.metadata.at(skey) +
                                 " is invalid: its entries must be >= 0 with a sum in [1, n_rot" +
                                 (n_rot > 0 ? " = " + std::to_string(n_rot) : std::string()) + "]");
        }
    }
    const int64_t tid = gguf_find_key(g, "tokenizer.ggml.tokens");
    if (tid >= 0 && gguf_get_kv_type(g, tid) == GGUF_TYPE_ARRAY && gguf_get_arr_type(g, tid) == GGUF_TYPE_STRING) {
        const size_t n = gguf_get_arr_n(g, tid);
        std::unordered_set<std::string_view> seen;
        seen.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            if (!seen.insert(gguf_get_arr_str(g, tid, i)).second) {
                throw ModelLoadError(path + ": tokenizer.ggml.tokens has a duplicate token at index " +
                                     std::to_string(i));
            }
        }
    }
}

// llama.cpp reads llama_max_devices() floats from the pointer
std::vector<float> tensor_split_array(const std::vector<float>& shares) {
    if (shares.empty()) return {};
    const size_t max = llama_max_devices();
    if (shares.size() > max) {
        throw InvalidArgument("tensor_split has " + std::to_string(shares.size()) + " entries; this build supports " +
                              std::to_string(max) + " devices");
    }
    std::vector<float> out(shares);
    out.resize(max, 0.0f);
    return out;
}

bool is_endpoint(const std::string& e) {
    const size_t colon = e.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == e.size()) return false;
    const std::string port = e.substr(colon + 1);
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return false;
    const int n = std::stoi(port);
    return n > 0 && n < 65536;
}

}  // namespace

void ModelParams::validate() const {
    if (n_gpu_layers < -1) throw InvalidArgument("n_gpu_layers must be >= -1, got " + std::to_string(n_gpu_layers));
    if (main_gpu < -1) {
        throw InvalidArgument("main_gpu must be >= -1 (-1: no GPU with split_mode none), got " +
                              std::to_string(main_gpu));
    }
    check_choice("split_mode", split_mode);
    bool any = false;
    for (float f : tensor_split) {
        if (!std::isfinite(f))
            throw InvalidArgument("tensor_split entries must be finite and >= 0, got " + std::to_string(f));
        if (f < 0.0f) throw InvalidArgument("tensor_split entries must be >= 0, got " + std::to_string(f));
        any = any || f > 0.0f;
    }
    if (!tensor_split.empty() && !any) throw InvalidArgument("tensor_split entries must be >= 0 and not all 0");
    for (const auto& e : rpc_servers) {
        if (!is_endpoint(e)) throw InvalidArgument("rpc_servers entries must be 'host:port', got '" + e + "'");
    }
}

bool GgufInfo::has_tensor(const std::string& name) const {
    return std::find(tensor_names.begin(), tensor_names.end(), name) != tensor_names.end();
}

GgufInfo inspect_gguf(const std::string& path) {
    std::error_code ec;
    const fs::path p(path);
    if (!fs::exists(p, ec)) throw ModelLoadError(path + ": file not found");
    if (fs::is_directory(p, ec)) throw ModelLoadError(path + ": is a directory, not a GGUF file");
    if (!fs::is_regular_file(p, ec)) throw ModelLoadError(path + ": not a regular file");
    {
        std::ifstream f(p, std::ios::binary);
        if (!f) throw ModelLoadError(path + ": cannot be opened for reading");
        char magic[4] = {};
        f.read(magic, 4);
        if (f.gcount() < 4 || std::memcmp(magic, "GGUF", 4) != 0) {
            throw ModelLoadError(path + ": not a GGUF file (bad magic)");
        }
    }
    ensure_backend();
    take_thread_errors();
    gguf_init_params gp{};
    gp.no_alloc = true;
    gp.ctx = nullptr;
    GgufPtr g(gguf_init_from_file(path.c_str(), gp));
    if (!g) {
        const std::string logged = take_thread_errors();
        throw ModelLoadError(path + ": corrupt or truncated GGUF header" +
                             (logged.empty() ? std::string() : " (" + logged + ")"));
    }
    GgufInfo info;
    for (int64_t i = 0; i < gguf_get_n_kv(g.get()); ++i) {
        info.metadata[gguf_get_key(g.get(), i)] = gguf_value_text(g.get(), i);
    }
    for (int64_t i = 0; i < gguf_get_n_tensors(g.get()); ++i) {
        info.tensor_names.emplace_back(gguf_get_tensor_name(g.get(), i));
    }
    const auto it = info.metadata.find("general.architecture");
    if (it == info.metadata.end()) {
        throw ModelLoadError(path + ": GGUF file has no general.architecture key");
    }
    info.architecture = it->second;
    validate_header(g.get(), info, path);
    return info;
}

std::shared_ptr<Model> Model::load(const std::string& path, const ModelParams& params, const std::string& role) {
    params.validate();
    GgufInfo info = inspect_gguf(path);
    if (info.architecture == "dflash-draft") {
        throw ModelLoadError(path +
                             ": architecture 'dflash-draft' is the old pre-merge DFlash format, which this "
                             "llama.cpp cannot load; re-convert the drafter with llama.cpp's converter "
                             "(convert_hf_to_gguf.py --target-model-dir ...) to architecture 'dflash'");
    }
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = params.n_gpu_layers;
    if (params.use_mlock) {
        mp.load_mode = params.use_mmap ? LLAMA_LOAD_MODE_MMAP_MLOCK : LLAMA_LOAD_MODE_MLOCK;
    } else if (!params.use_mmap) {
        mp.load_mode = LLAMA_LOAD_MODE_NONE;
    }
    mp.main_gpu = params.main_gpu;
    mp.load_mtp = params.load_mtp;
    mp.split_mode = parse_split_mode(params.split_mode);
    std::vector<float> split = tensor_split_array(params.tensor_split);
    if (!split.empty()) mp.tensor_split = split.data();
    std::vector<ggml_backend_dev_t> devices = offload_devices(params.rpc_servers);
    if (!devices.empty()) mp.devices = devices.data();
    take_thread_errors();
    llama_model* raw = llama_model_load_from_file(path.c_str(), mp);
    if (raw == nullptr) {
        throw ModelLoadError(path + ": failed to load " + role + " model (architecture '" + info.architecture +
                             "'): " + load_failure_reason(take_thread_errors()));
    }
    std::shared_ptr<Model> m(new Model());
    m->model_.reset(raw);
    m->vocab_ = llama_model_get_vocab(raw);
    if (m->vocab_ == nullptr) throw ModelLoadError(path + ": model has no vocabulary");
    m->path_ = path;
    m->info_ = std::move(info);
    m->mtp_loaded_ = params.load_mtp && m->n_layer_nextn() > 0;
    for (llama_token t = 0; t < m->n_vocab(); ++t) {
        if (llama_vocab_is_eog(m->vocab_, t)) m->eog_.push_back(t);
    }
    return m;
}

int32_t Model::n_embd() const { return llama_model_n_embd(model_.get()); }
int32_t Model::n_layer() const { return llama_model_n_layer(model_.get()); }
int32_t Model::n_layer_nextn() const { return llama_model_n_layer_nextn(model_.get()); }
int32_t Model::n_vocab() const { return llama_vocab_n_tokens(vocab_); }
int32_t Model::n_ctx_train() const { return llama_model_n_ctx_train(model_.get()); }
uint64_t Model::n_params() const { return llama_model_n_params(model_.get()); }
uint64_t Model::size_bytes() const { return llama_model_size(model_.get()); }
bool Model::is_recurrent() const { return llama_model_is_recurrent(model_.get()); }
bool Model::is_hybrid() const { return llama_model_is_hybrid(model_.get()); }

std::string Model::description() const {
    char buf[256] = {};
    llama_model_desc(model_.get(), buf, sizeof(buf));
    return buf;
}

void Model::check_token(llama_token token) const {
    if (token < 0 || token >= n_vocab()) {
        throw InvalidArgument("token id " + std::to_string(token) + " is out of range [0, " +
                              std::to_string(n_vocab()) + ")");
    }
}

std::vector<llama_token> Model::tokenize(const std::string& text, bool add_special, bool parse_special) const {
    if (text.size() > static_cast<size_t>(INT32_MAX / 2)) throw InvalidArgument("text is too long");
    const auto len = static_cast<int32_t>(text.size());
    std::vector<llama_token> out(static_cast<size_t>(len) + 8);
    int32_t n = llama_tokenize(vocab_, text.data(), len, out.data(), static_cast<int32_t>(out.size()), add_special,
                               parse_special);
    if (n < 0) {
        out.resize(static_cast<size_t>(-n));
        n = llama_tokenize(vocab_, text.data(), len, out.data(), static_cast<int32_t>(out.size()), add_special,
                           parse_special);
    }
    if (n < 0) throw Error("tokenization failed");
    out.resize(static_cast<size_t>(n));
    return out;
}

std::string Model::detokenize(const std::vector<llama_token>& tokens, bool remove_special, bool unparse_special) const {
    for (llama_token t : tokens) check_token(t);
    std::string out(tokens.size() * 8 + 16, '\0');
    int32_t n = llama_detokenize(vocab_, tokens.data(), static_cast<int32_t>(tokens.size()), out.data(),
                                 static_cast<int32_t>(out.size()), remove_special, unparse_special);
    if (n < 0) {
        out.resize(static_cast<size_t>(-n));
        n = llama_detokenize(vocab_, tokens.data(), static_cast<int32_t>(tokens.size()), out.data(),
                             static_cast<int32_t>(out.size()), remove_special, unparse_special);
    }
    if (n < 0) throw Error("detokenization failed");
    out.resize(static_cast<size_t>(n));
    return out;
}

std::string Model::token_to_piece(llama_token token, bool special) const {
    check_token(token);
    char buf[256];
    int32_t n = llama_token_to_piece(vocab_, token, buf, sizeof(buf), 0, special);
    if (n < 0) {
        std::string big(static_cast<size_t>(-n), '\0');
        n = llama_token_to_piece(vocab_, token, big.data(), static_cast<int32_t>(big.size()), 0, special);
        if (n < 0) throw Error("token_to_piece failed");
        big.resize(static_cast<size_t>(n));
        return big;
    }
    return std::string(buf, static_cast<size_t>(n));
}

std::vector<std::string> Model::token_pieces(const std::vector<llama_token>& tokens, bool special) const {
    for (llama_token t : tokens) check_token(t);
    std::vector<std::string> out;
    out.reserve(tokens.size());
    for (llama_token t : tokens) out.push_back(token_to_piece(t, special));
    return out;
}

std::vector<std::pair<std::string, llama_token>> Model::fim_tokens() const {
    const std::pair<const char*, llama_token> parts[] = {
        {"pre", llama_vocab_fim_pre(vocab_)}, {"suf", llama_vocab_fim_suf(vocab_)},
        {"mid", llama_vocab_fim_mid(vocab_)}, {"pad", llama_vocab_fim_pad(vocab_)},
        {"rep", llama_vocab_fim_rep(vocab_)}, {"sep", llama_vocab_fim_sep(vocab_)},
    };
    std::vector<std::pair<std::string, llama_token>> out;
    for (const auto& [part, t] : parts) {
        if (t != LLAMA_TOKEN_NULL) out.emplace_back(part, t);
    }
    return out;
}

bool Model::is_eog(llama_token token) const { return llama_vocab_is_eog(vocab_, token); }
llama_token Model::bos() const { return llama_vocab_bos(vocab_); }
llama_token Model::eos() const { return llama_vocab_eos(vocab_); }
bool Model::add_bos() const { return llama_vocab_get_add_bos(vocab_); }

}  // namespace pydflash
