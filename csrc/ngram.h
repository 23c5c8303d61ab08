// llama.cpp's n-gram drafters (common/speculative.cpp), which draft from a
// sequence's own history: one draft source (draft_source.h) of the listed types,
// tried in llama.cpp's fixed priority order before the model drafter; the first
// non-empty draft wins (its --spec-type semantics), and each type learns only
// from the drafts it made.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "draft_source.h"
#include "llama.h"
#include "pair_params.h"

struct common_speculative;

namespace pydflash {

// llama.cpp's --spec-type names, in its priority order (n-gram first).
const std::vector<std::string>& speculative_type_names();
bool is_ngram_type(const std::string& name);
// InvalidArgument for an unknown, repeated or unsupported name (what to do instead).
void check_speculative_types(const std::vector<std::string>& names);

class NgramDrafters final : public DraftSource {
public:
    // Only the n-gram names of `types` are used; n_seq sequences.
    NgramDrafters(const std::vector<std::string>& types, const NgramParams& params, int32_t n_seq);
    ~NgramDrafters() override;
    NgramDrafters(const NgramDrafters&) = delete;
    NgramDrafters& operator=(const NgramDrafters&) = delete;

    void describe(DraftInfo& info) const override;
    // A sequence's history was replaced (a prefill, a loaded slot).
    void begin(int32_t seq, const std::vector<llama_token>& history) override;
    // Each open request's draft from the first type that has one, as long as the
    // round leaves room for (llama.cpp's draft_max bounds the model's block only).
    void draft(DraftRound& round) override;
    // After verification: n_accepted tokens of this step's draft were kept. As in
    // llama.cpp, the type of the last draft made is told when it was the sequence's
    // last draft (`mine`; 0 after a step without one).
    void accept(int32_t seq, int32_t n_accepted, bool mine) override;

private:
    // The first type's draft of at most n_max tokens after history + last (position pos0),
    // or empty; `kind` gets its kind.
    std::vector<llama_token> draft(int32_t seq, const std::vector<llama_token>& history, llama_token last,
                                   llama_pos pos0, int32_t n_max, DraftKind& kind);

    struct Free {
        void operator()(common_speculative* spec) const;
    };
    struct Source {
        DraftKind kind;
        std::unique_ptr<common_speculative, Free> spec;  // freed even when a later one fails to start
    };
    std::vector<Source> srcs_;
    std::vector<int32_t> last_;  // per sequence: the type of its last n-gram draft (-1: none yet)
};

}  // namespace pydflash
