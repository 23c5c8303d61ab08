// Slot files (slot_state.h): the file format as free functions, and the pair's
// side, a sequence's state handed out and taken back.
#include "slot_state.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend.h"
#include "context_pair.h"
#include "errors.h"

namespace pydflash {
namespace {

constexpr char kMagic[8] = {'P', 'D', 'F', 'S', 'L', 'O', 'T', '1'};

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

void write_slot_file(const std::string& path, const SlotState& st) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) throw InvalidArgument(path + ": cannot write the slot file");
    f.write(kMagic, sizeof(kMagic));
    put<uint64_t>(f, st.fingerprint.size());
    f.write(st.fingerprint.data(), static_cast<std::streamsize>(st.fingerprint.size()));
    put<uint64_t>(f, st.history.size());
    f.write(reinterpret_cast<const char*>(st.history.data()),
            static_cast<std::streamsize>(st.history.size() * sizeof(llama_token)));
    put<int32_t>(f, st.pending);
    put_bytes(f, st.target);
    put_bytes(f, st.drafter);
    f.flush();
    if (!f) throw InvalidArgument(path + ": writing the slot file failed");
}

// The header (magic, fingerprint), checked as it is read.
void read_header(std::ifstream& f, const std::string& path, const SlotCheck& c, SlotState& st) {
    char magic[sizeof(kMagic)];
    if (!f.read(magic, sizeof(magic)) || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
        throw InvalidArgument(path + ": not a pydflash slot file");
    }
    const auto n_fp = get<uint64_t>(f, path);
    if (n_fp > 4096) throw InvalidArgument(path + ": corrupt slot file");
    st.fingerprint.assign(n_fp, '\0');
    if (!f.read(st.fingerprint.data(), static_cast<std::streamsize>(n_fp))) {
        throw InvalidArgument(path + ": truncated slot file");
    }
    if (st.fingerprint != c.fingerprint) {
        throw InvalidArgument(path + ": saved from other models or settings (" + st.fingerprint + "), this pair is " +
                              c.fingerprint);
    }
}

// A slot file (opened at its end), checked against the pair in the order its parts come.
SlotState read_slot_file(std::ifstream& f, const std::string& path, const SlotCheck& c) {
    const auto size = static_cast<uint64_t>(f.tellg());
    f.seekg(0);
    SlotState st;
    st.origin = path;
    read_header(f, path, c, st);
    const auto n_hist = get<uint64_t>(f, path);
    if (n_hist >= static_cast<uint64_t>(c.n_ctx_seq)) {
        throw InvalidArgument(path + ": " + std::to_string(n_hist) + " tokens do not fit a sequence's context of " +
                              std::to_string(c.n_ctx_seq));
    }
    st.history.resize(n_hist);
    if (!f.read(reinterpret_cast<char*>(st.history.data()),
                static_cast<std::streamsize>(n_hist * sizeof(llama_token)))) {
        throw InvalidArgument(path + ": truncated slot file");
    }
    for (llama_token t : st.history) c.target->check_token(t);
    st.pending = get<int32_t>(f, path);
    if (st.pending >= 0) c.target->check_token(st.pending);
    st.target = get_bytes(f, path, size);
    st.drafter = get_bytes(f, path, size);
    if (st.drafter.empty() != !c.drafter) throw InvalidArgument(path + ": the drafter's part does not match this pair");
    return st;
}

}  // namespace

std::string describe_model(const Model& m) {
    char buf[256] = {0};
    llama_model_desc(m.get(), buf, sizeof(buf));
    return std::string(buf) + ", " + std::to_string(llama_model_n_params(m.get())) + " params, vocab " +
           std::to_string(m.n_vocab());
}

namespace {

// A new file or a regular one: opening a FIFO waits for its other end, a device may never end
void require_regular_file(const std::string& path, bool must_exist) {
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (must_exist && st.type() == std::filesystem::file_type::not_found) {
        throw InvalidArgument(path + ": no such slot file");
    }
    if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
        throw InvalidArgument(path + ": not a regular file");
    }
}

}  // namespace

void save_sequence(ContextPair& pair, int32_t seq, const std::string& path) {
    require_regular_file(path, false);
    write_slot_file(path, pair.save_state(seq));
}

void load_sequence(ContextPair& pair, int32_t seq, const std::string& path) {
    require_regular_file(path, true);
    // opened before the pair's lock, which no open can then hold
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) throw InvalidArgument(path + ": cannot read the slot file");
    pair.load_state(seq, [&](const SlotCheck& c) { return read_slot_file(f, path, c); });
}

SlotState ContextPair::save_state(int32_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    const Sequence& s = seq_at(seq);
    if (!s.prompt.empty()) throw InvalidArgument("sequence " + std::to_string(seq) + " is still evaluating a prompt");
    sources_->sync(seq);  // the drafter's cache holds every kept position
    SlotState st;
    st.target = seq_state(ctx_tgt_.get(), seq);
    // the MTP head's cache is saved as a drafter's (its carried hidden row is not: llama.cpp
    // keeps it private, so the first draft after a load pairs with an older one)
    if (llama_context* dctx = sources_->state_context()) st.drafter = seq_state(dctx, seq);
    st.fingerprint = info_.fingerprint;
    st.history = s.history;
    st.pending = s.pending ? *s.pending : -1;
    return st;
}

void ContextPair::load_state(int32_t seq, const std::function<SlotState(const SlotCheck&)>& read) {
    std::lock_guard<std::mutex> lock(mu_);
    seq_at(seq);  // in range
    llama_context* dctx = sources_->state_context();
    SlotState st = read({info_.fingerprint, n_ctx_seq(), target_.get(), dctx != nullptr});

    // from here the sequence is replaced: a failure leaves it empty
    clear_sequence(seq);
    Sequence& s = seqs_[static_cast<size_t>(seq)];
    if (llama_state_seq_set_data_ext(ctx_tgt_.get(), st.target.data(), st.target.size(), seq, 0) != st.target.size() ||
        (dctx &&
         llama_state_seq_set_data_ext(dctx, st.drafter.data(), st.drafter.size(), seq, 0) != st.drafter.size())) {
        clear_sequence(seq);
        throw InvalidArgument(st.origin + ": llama.cpp refused the saved state: " + take_thread_errors());
    }
    s.history = std::move(st.history);
    s.n_past = static_cast<int32_t>(s.history.size());
    if (st.pending >= 0) s.pending = st.pending;
    sources_->begin(seq, s.history);
}

}  // namespace pydflash
