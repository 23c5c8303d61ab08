// llama.cpp's n-gram drafters (common/speculative.cpp), which draft from a
// sequence's own history. They are tried in llama.cpp's fixed priority order
// before the model drafter; the first non-empty draft wins (its --spec-type
// semantics), and each source learns only from the drafts it made.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llama.h"
#include "pair_params.h"

struct common_speculative;

namespace pydflash {

// llama.cpp's --spec-type names, in its priority order (n-gram first).
const std::vector<std::string>& speculative_type_names();
bool is_ngram_type(const std::string& name);
// InvalidArgument for an unknown, repeated or unsupported name (what to do instead).
void check_speculative_types(const std::vector<std::string>& names);

class NgramDrafters {
public:
    // Only the n-gram names of `types` are used; n_seq sequences.
    NgramDrafters(const std::vector<std::string>& types, const NgramParams& params, int32_t n_seq);
    ~NgramDrafters();
    NgramDrafters(const NgramDrafters&) = delete;
    NgramDrafters& operator=(const NgramDrafters&) = delete;

    // A sequence's history was replaced (a prefill, a loaded slot, a reset).
    void begin(int32_t seq, const std::vector<llama_token>& history);
    // The first source's draft of at most n_max tokens after history + last
    // (position pos0), or empty; `source` gets its name.
    std::vector<llama_token> draft(int32_t seq, const std::vector<llama_token>& history, llama_token last,
                                   llama_pos pos0, int32_t n_max, std::string& source);
    // This step's draft came from the model drafter.
    void model_drafted(int32_t seq) { last_.at(static_cast<size_t>(seq)) = -1; }
    // After verification: n_accepted tokens of this step's draft were kept. As in
    // llama.cpp, the source of the last draft made is told (0 after a step without one).
    void accept(int32_t seq, int32_t n_accepted);

private:
    struct Source {
        std::string name;
        common_speculative* spec;
    };
    std::vector<Source> srcs_;
    std::vector<int32_t> last_;  // per sequence: the source of its last draft (-1: the model, or none)
};

}  // namespace pydflash
