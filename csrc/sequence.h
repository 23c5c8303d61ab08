// What one sequence (a slot) of the pair holds: its token history in the
// target's cache, the token pending for its next step, its sampler, grammar
// and checkpoint. The drafter and the acceptor read it; the pair owns it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "grammar.h"
#include "llama.h"
#include "rollback.h"
#include "sampler.h"

namespace pydflash {

struct Sequence {
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<Grammar> grammar;        // null: unconstrained
    std::unique_ptr<Grammar> draft_grammar;  // the copy the drafter walks (its state reset each step)
    std::unique_ptr<Grammar> grammar_start;  // its state after the spec's prefill: each prefill returns to it
    std::vector<llama_token> history;        // tokens in the target cache
    std::optional<llama_token> pending;
    std::vector<llama_token> prompt;  // a prefill in progress: the whole prompt ...
    int32_t n_past = 0;               // ... of which history holds the first n_past
    bool defer_prompt = false;        // ... whose rows' features wait as a plain step's do
    int32_t n_cached = 0;             // prompt tokens the last prefill took from the cache
    StateCheckpoint checkpoint;
};

// The penalty window before this step: the last penalty_last_n tokens of history + pending.
inline std::vector<llama_token> recent_tokens(const Sequence& s) {
    const SamplingParams& sp = s.sampler->params();
    if (!sp.has_penalties() || sp.penalty_last_n == 0) return {};
    // without copying the whole history
    const size_t n_hist = std::min(s.history.size(), static_cast<size_t>(sp.penalty_last_n) - 1);
    std::vector<llama_token> out(s.history.end() - static_cast<std::ptrdiff_t>(n_hist), s.history.end());
    out.push_back(*s.pending);
    return out;
}

// The window after `t` is drafted or accepted.
inline void push_recent(std::vector<llama_token>& win, llama_token t, int32_t last_n) {
    if (last_n <= 0) return;
    win.push_back(t);
    if (win.size() > static_cast<size_t>(last_n)) win.erase(win.begin());
}

}  // namespace pydflash
