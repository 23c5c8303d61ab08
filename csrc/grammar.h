// Grammar-constrained output (GBNF, and JSON schemas through llama.cpp's
// converter) with llama.cpp's own grammar engine. The target's rows are masked
// (disallowed tokens to -inf) before the sampler chain, as llama.cpp's
// grammar-first sampling does, so the constrained distribution is exact; only
// emitted tokens advance the grammar, so a rejected draft never touches it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llama.h"

struct llama_grammar;
struct llama_grammar_element;

namespace pydflash {

struct GrammarSpec {
    std::string gbnf;  // empty: no grammar
    // lazy: inactive until a trigger (a regex on the output so far, or a token)
    // appears, as for the tool-call grammars of chat templates
    bool lazy = false;
    std::vector<std::string> trigger_patterns;
    std::vector<llama_token> trigger_tokens;
    // tokens the grammar consumes before the output (a template's generation prompt)
    std::vector<llama_token> prefill;
};

// Why `gbnf` does not parse ("" if it does): the first error of llama.cpp's parser,
// an undefined rule, or a missing "root".
std::string grammar_error(const std::string& gbnf);

// llama.cpp's JSON-schema-to-GBNF converter; InvalidArgument for bad JSON or a
// schema it cannot convert.
std::string json_schema_to_gbnf(const std::string& schema_json);

struct GrammarDeleter {
    void operator()(llama_grammar* g) const noexcept;
};

// The tokens a grammar state allows, by state: structural positions (after a key, at
// the end) recur, and masking the whole vocabulary is the grammar's main cost. Shared
// by a grammar and its copies (a state is named by rule and element indices, which
// copies share; the element addresses they do not).
struct MaskCache;

class Grammar {
public:
    // InvalidArgument when the grammar does not parse (nothing is printed). `cache`:
    // the allowed-token cache of an earlier Grammar of the same GBNF text (the same
    // rules), or null for a new one.
    Grammar(const llama_vocab* vocab, const GrammarSpec& spec, std::shared_ptr<MaskCache> cache = nullptr);
    const std::shared_ptr<MaskCache>& cache() const { return cache_; }
    ~Grammar();

    // An independent copy of the current state (the drafter walks one along its block).
    std::unique_ptr<Grammar> clone() const;
    // Takes `other`'s state (a copy of the same grammar): cheaper than a new clone,
    // which copies every rule.
    void assign_state(const Grammar& other);

    bool allows(llama_token t);  // t is allowed next
    // The allowed tokens of the current state (sorted) when they are known already,
    // else null; then `allows_one` checks one token without computing the state's key.
    const std::vector<llama_token>* known_allowed();
    bool allows_one(llama_token t);
    // Which of `tokens` the grammar allows next, in one pass over its stacks (far
    // cheaper than one check per token); Interrupted as mask().
    std::vector<bool> allows_each(const std::vector<llama_token>& tokens);
    // Sets the disallowed entries of a logits row to -inf (the whole vocabulary).
    // Interrupted when the stop check (set_stop) says so between chunks of it.
    void mask(float* logits, int32_t n_vocab);
    // Advances past an emitted token; GrammarError when the grammar cannot take it,
    // or when more than GrammarLimits::kStacks alternatives are alive after it.
    void accept(llama_token t);
    // What mask() asks between chunks of the vocabulary (the pair's abort check, as
    // a decode asks it): true stops the work. Copies (clone) keep it.
    using StopCheck = bool (*)(void*);
    void set_stop(StopCheck check, void* data) {
        stop_ = check;
        stop_data_ = data;
    }

private:
    Grammar(const llama_vocab* vocab, llama_grammar* g, std::shared_ptr<MaskCache> cache);
    // The current state's cache key in key_ (computed once per state); false: not
    // cacheable (a lazy grammar waiting for its trigger).
    bool state_key();
    // The rule and offset of a stack element of this copy (false: not in its rules).
    bool locate(const llama_grammar_element* e, uint32_t& rule, uint32_t& offset) const;
    void index_rules();
    // llama.cpp's verdict on each of cur_ (disallowed: -inf), asking the stop check between chunks
    void apply_to_cur();

    const llama_vocab* vocab_;
    std::unique_ptr<llama_grammar, GrammarDeleter> g_;
    std::shared_ptr<MaskCache> cache_;
    // each rule's element range in this copy, by address: (begin, rule index)
    std::vector<std::pair<const void*, uint32_t>> rule_at_;
    std::vector<llama_token_data> cur_;
    std::string key_;
    int key_known_ = -1;  // key_ is the current state's: -1 not yet, 0 not cacheable, 1 yes
    StopCheck stop_ = nullptr;
    void* stop_data_ = nullptr;
};

}  // namespace pydflash
