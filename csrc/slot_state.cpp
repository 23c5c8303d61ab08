// A sequence's state on disk: its token history, its pending token and both
// contexts' memory of it (the target's KV cache and recurrent state, the
// drafter's injected features), so a conversation can continue later, in this
// pair or another one on the same model files, without evaluating it again.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backend.h"
#include "context_pair.h"
#include "errors.h"

namespace pydflash {
namespace {

constexpr char kMagic[8] = {'P', 'D', 'F', 'S', 'L', 'O', 'T', '1'};

std::string describe(const Model& m) {
    char buf[256] = {0};
    llama_model_desc(m.get(), buf, sizeof(buf));
    return std::string(buf) + ", " + std::to_string(llama_model_n_params(m.get())) + " params, vocab " +
           std::to_string(m.n_vocab());
}

template <typename T>
void put(std::ofstream& f, const T& v) {
    f.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

void put_bytes(std::ofstream& f, const std::vector<uint8_t>& b) {
    put<uint64_t>(f, b.size());
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

template <typename T>
T get(std::ifstream& f, const std::string& path) {
    T v{};
    if (!f.read(reinterpret_cast<char*>(&v), sizeof(T))) throw InvalidArgument(path + ": truncated slot file");
    return v;
}

std::vector<uint8_t> get_bytes(std::ifstream& f, const std::string& path, uint64_t file_size) {
    const auto n = get<uint64_t>(f, path);
    const auto left = file_size - static_cast<uint64_t>(f.tellg());
    if (n > left) {
        throw InvalidArgument(path + ": truncated slot file (a section of " + std::to_string(n) + " bytes, " +
                              std::to_string(left) + " left)");
    }
    std::vector<uint8_t> b(n);
    if (!f.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(n))) {
        throw InvalidArgument(path + ": truncated slot file");
    }
    return b;
}

std::vector<uint8_t> seq_state(llama_context* ctx, llama_seq_id seq) {
    std::vector<uint8_t> b(llama_state_seq_get_size_ext(ctx, seq, 0));
    const size_t n = llama_state_seq_get_data_ext(ctx, b.data(), b.size(), seq, 0);
    if (n == 0 && !b.empty()) throw Error("llama.cpp could not save sequence " + std::to_string(seq) + "'s state");
    b.resize(n);
    return b;
}

}  // namespace

std::string ContextPair::fingerprint() const {
    const std::string dft = drafter_ ? describe(*drafter_) : mtp_ ? "the target's MTP head" : "none";
    return "target: " + describe(*target_) + "; drafter: " + dft + "; rollback " + rollback_name(rollback_) +
           ", n_rs_seq " + std::to_string(n_rs_seq_) +
           (draft_window() > 0 ? ", draft window " + std::to_string(draft_window()) : "");
}

void ContextPair::save_sequence(int32_t seq, const std::string& path) {
    // a new file or a regular one: a FIFO's open would wait for a reader, under the lock
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
        throw InvalidArgument(path + ": not a regular file");
    }
    std::lock_guard<std::mutex> lock(mu_);
    const Sequence& s = seq_at(seq);
    if (!s.prompt.empty()) throw InvalidArgument("sequence " + std::to_string(seq) + " is still evaluating a prompt");
    if (dflash_) dflash_->flush_deferred({seq});  // the drafter's cache holds every kept position
    const std::vector<uint8_t> tgt = seq_state(ctx_tgt_.get(), seq);
    // the MTP head's cache is saved as a drafter's (its carried hidden row is not: llama.cpp
    // keeps it private, so the first draft after a load pairs with an older one)
    llama_context* dctx = dflash_ ? dflash_->ctx() : mtp_ ? mtp_->ctx() : nullptr;
    const std::vector<uint8_t> dft = dctx ? seq_state(dctx, seq) : std::vector<uint8_t>{};
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) throw InvalidArgument(path + ": cannot write the slot file");
    f.write(kMagic, sizeof(kMagic));
    const std::string fp = fingerprint();
    put<uint64_t>(f, fp.size());
    f.write(fp.data(), static_cast<std::streamsize>(fp.size()));
    put<uint64_t>(f, s.history.size());
    f.write(reinterpret_cast<const char*>(s.history.data()),
            static_cast<std::streamsize>(s.history.size() * sizeof(llama_token)));
    put<int32_t>(f, s.pending ? *s.pending : -1);
    put_bytes(f, tgt);
    put_bytes(f, dft);
    f.flush();
    if (!f) throw InvalidArgument(path + ": writing the slot file failed");
}

void ContextPair::load_sequence(int32_t seq, const std::string& path) {
    // only a regular file (opening a FIFO waits for a writer, a device may never end), opened
    // before the pair's lock, which no open can then hold
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (st.type() == std::filesystem::file_type::not_found) throw InvalidArgument(path + ": no such slot file");
    if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
        throw InvalidArgument(path + ": not a regular file");
    }
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) throw InvalidArgument(path + ": cannot read the slot file");
    std::lock_guard<std::mutex> lock(mu_);
    seq_at(seq);  // in range
    const auto size = static_cast<uint64_t>(f.tellg());
    f.seekg(0);
    char magic[sizeof(kMagic)];
    if (!f.read(magic, sizeof(magic)) || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
        throw InvalidArgument(path + ": not a pydflash slot file");
    }
    const auto n_fp = get<uint64_t>(f, path);
    if (n_fp > 4096) throw InvalidArgument(path + ": corrupt slot file");
    std::string fp(n_fp, '\0');
    if (!f.read(fp.data(), static_cast<std::streamsize>(n_fp))) throw InvalidArgument(path + ": truncated slot file");
    if (fp != fingerprint()) {
        throw InvalidArgument(path + ": saved from other models or settings (" + fp + "), this pair is " +
                              fingerprint());
    }
    const auto n_hist = get<uint64_t>(f, path);
    if (n_hist >= static_cast<uint64_t>(n_ctx_seq())) {
        throw InvalidArgument(path + ": " + std::to_string(n_hist) + " tokens do not fit a sequence's context of " +
                              std::to_string(n_ctx_seq()));
    }
    std::vector<llama_token> history(n_hist);
    if (!f.read(reinterpret_cast<char*>(history.data()), static_cast<std::streamsize>(n_hist * sizeof(llama_token)))) {
        throw InvalidArgument(path + ": truncated slot file");
    }
    for (llama_token t : history) target_->check_token(t);
    const auto pending = get<int32_t>(f, path);
    if (pending >= 0) target_->check_token(pending);
    const std::vector<uint8_t> tgt = get_bytes(f, path, size);
    const std::vector<uint8_t> dft = get_bytes(f, path, size);
    llama_context* dctx = dflash_ ? dflash_->ctx() : mtp_ ? mtp_->ctx() : nullptr;
    if (dft.empty() != !dctx) throw InvalidArgument(path + ": the drafter's part does not match this pair");

    // from here the sequence is replaced: a failure leaves it empty
    clear_sequence(seq);
    Sequence& s = seqs_[static_cast<size_t>(seq)];
    if (llama_state_seq_set_data_ext(ctx_tgt_.get(), tgt.data(), tgt.size(), seq, 0) != tgt.size() ||
        (dctx && llama_state_seq_set_data_ext(dctx, dft.data(), dft.size(), seq, 0) != dft.size())) {
        clear_sequence(seq);
        throw InvalidArgument(path + ": llama.cpp refused the saved state: " + take_thread_errors());
    }
    s.history = std::move(history);
    s.n_past = static_cast<int32_t>(s.history.size());
    if (pending >= 0) s.pending = pending;
    history_replaced(seq);
}

}  // namespace pydflash
