// A sequence's state on disk (a slot file): its token history, its pending token
// and both contexts' memory of it (the target's KV cache and recurrent state, the
// drafter's injected features), so a conversation can continue later, in this
// pair or another one on the same model files, without evaluating it again.
// ContextPair hands a sequence's state out and takes one back (save_state,
// load_state); the file format lives here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llama.h"
#include "model.h"

namespace pydflash {

class ContextPair;

// One sequence's state, as a slot file holds it.
struct SlotState {
    std::string origin;       // where it came from (the file): error messages name it
    std::string fingerprint;  // the models and settings it was saved with
    std::vector<llama_token> history;
    llama_token pending = -1;      // -1: none
    std::vector<uint8_t> target;   // llama.cpp's state of the sequence in the target context
    std::vector<uint8_t> drafter;  // ... in the drafter's (empty: the pair has none)
};

// What a state must match to load into a pair.
struct SlotCheck {
    std::string fingerprint;
    int32_t n_ctx_seq = 0;  // the history must leave room for a token
    const Model* target;    // the tokens must be its
    bool drafter = false;   // the pair has a drafter context
};

// "<desc>, <n> params, vocab <n>": how a slot file names a model.
std::string describe_model(const Model& m);

// Sequence `seq` of `pair` to the file `path`, and back (InvalidArgument naming the
// file when it cannot be written or read, is not a slot file or does not match the pair).
void save_sequence(ContextPair& pair, int32_t seq, const std::string& path);
void load_sequence(ContextPair& pair, int32_t seq, const std::string& path);

}  // namespace pydflash
