// A loaded GGUF model (target or drafter), with the file checks done before
// llama.cpp sees the file, and the vocabulary helpers Python needs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "handles.h"

namespace pydflash {

struct ModelParams {
    int n_gpu_layers = 0;  // < 0: all layers
    bool use_mmap = true;
    bool use_mlock = false;                // keep the weights in RAM (llama.cpp's --mlock)
    int main_gpu = 0;                      // the device used with split_mode "none" (-1: none, the CPU)
    std::string split_mode = "layer";      // "none", "layer" or "row" (across GPUs)
    std::vector<float> tensor_split;       // share per device; empty: by free memory
    std::vector<std::string> rpc_servers;  // "host:port" of llama.cpp RPC servers
    bool load_mtp = false;                 // also load next-token-prediction (MTP) layers, for draft-mtp

    void validate() const;  // InvalidArgument naming the first bad value
};

// What the GGUF header says, read without loading any weights.
struct GgufInfo {
    std::string architecture;
    std::map<std::string, std::string> metadata;  // scalar values as text; arrays summarised
    std::vector<std::string> tensor_names;
    bool has_tensor(const std::string& name) const;
};

// Reads a GGUF header; throws ModelLoadError naming the file and the reason.
GgufInfo inspect_gguf(const std::string& path);

class Model {
public:
    // `role` ("target" or "drafter") only words the error messages.
    static std::shared_ptr<Model> load(const std::string& path, const ModelParams& params, const std::string& role);

    llama_model* get() const { return model_.get(); }
    const llama_vocab* vocab() const { return vocab_; }
    const std::string& path() const { return path_; }
    const GgufInfo& info() const { return info_; }
    const std::string& architecture() const { return info_.architecture; }

    int32_t n_embd() const;
    int32_t n_layer() const;
    int32_t n_layer_nextn() const;                   // next-token-prediction (MTP) layers in the file
    bool mtp_loaded() const { return mtp_loaded_; }  // ... and loaded (ModelParams::load_mtp)
    int32_t n_vocab() const;
    int32_t n_ctx_train() const;
    uint64_t n_params() const;
    uint64_t size_bytes() const;
    bool is_recurrent() const;
    bool is_hybrid() const;
    std::string description() const;

    std::vector<llama_token> tokenize(const std::string& text, bool add_special, bool parse_special) const;
    std::string detokenize(const std::vector<llama_token>& tokens, bool remove_special, bool unparse_special) const;
    std::string token_to_piece(llama_token token, bool special) const;
    // every token's piece in one call (the whole vocabulary in milliseconds); InvalidArgument
    // before any work if one id is out of range
    std::vector<std::string> token_pieces(const std::vector<llama_token>& tokens, bool special) const;
    bool is_eog(llama_token token) const;
    // the ids llama_vocab_is_eog holds, ascending (found once, at load)
    const std::vector<llama_token>& eog_tokens() const { return eog_; }
    // the FIM tokens the vocabulary has, as llama.cpp finds them (the GGUF's ids, else known
    // texts), by part: "pre", "suf", "mid", "pad", "rep", "sep"
    std::vector<std::pair<std::string, llama_token>> fim_tokens() const;
    llama_token bos() const;
    llama_token eos() const;
    bool add_bos() const;
    void check_token(llama_token token) const;  // InvalidArgument if out of range

private:
    Model() = default;
    ModelPtr model_;
    const llama_vocab* vocab_ = nullptr;
    std::string path_;
    GgufInfo info_;
    bool mtp_loaded_ = false;
    std::vector<llama_token> eog_;
};

}  // namespace pydflash
