#include "grammar.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <unordered_map>
#include <utility>

#include "common/json-schema-to-grammar.h"
#include "common/json.h"
#include "errors.h"
#include "grammar_limits.h"
#include "llama-grammar.h"

namespace pydflash {

namespace {

// llama.cpp's parser's whitespace and comments between rules
const char* skip_space(const char* p) {
    while (*p) {
        if (*p == '#') {
            while (*p && *p != '\n' && *p != '\r') ++p;
        } else if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
            ++p;
        } else {
            break;
        }
    }
    return p;
}

}  // namespace

std::string grammar_error(const std::string& gbnf) {
    check_gbnf_limits(gbnf);  // before the parser, which recurses per nested group
    // llama_grammar_parser::parse() prints its error to stderr and returns false;
    // its rule loop is run here instead, to keep the message and print nothing
    llama_grammar_parser parser;
    try {
        const char* pos = skip_space(gbnf.c_str());
        while (*pos) pos = parser.parse_rule(pos);
        for (const auto& rule : parser.rules) {
            if (rule.empty()) return "a rule is referenced but not defined";
            for (const auto& elem : rule) {
                if (elem.type != LLAMA_GRETYPE_RULE_REF) continue;
                if (elem.value >= parser.rules.size() || parser.rules[elem.value].empty()) {
                    for (const auto& [name, id] : parser.symbol_ids) {
                        if (id == elem.value) return "undefined rule '" + name + "'";
                    }
                    return "a rule is referenced but not defined";
                }
            }
        }
    } catch (const std::exception& e) {
        return e.what();
    }
    if (parser.rules.empty()) return "the grammar is empty";
    if (parser.symbol_ids.find("root") == parser.symbol_ids.end()) return "the grammar has no 'root' rule";
    return "";
}

std::string json_schema_to_gbnf(const std::string& schema_json) {
    check_json_depth(schema_json, "json_schema");
    common_json schema;
    try {
        schema = common_json::parse(schema_json);
    } catch (const std::exception& e) {
        throw InvalidArgument(std::string("json_schema is not valid JSON: ") + e.what());
    }
    check_schema_limits(schema);
    try {
        return json_schema_to_grammar(schema);
    } catch (const std::exception& e) {
        throw InvalidArgument(std::string("json_schema cannot be converted to a grammar: ") + e.what());
    }
}

void GrammarDeleter::operator()(llama_grammar* g) const noexcept { llama_grammar_free_impl(g); }

namespace {

// Each alive alternative is a parse stack, and llama.cpp's work per token grows with
// their number times the number each one advances to (its de-duplication is
// quadratic): a grammar of many optional items in a row ("a"? "a"? ...) holds
// hundreds and takes seconds per token.
std::string too_ambiguous(size_t n) {
    return "the grammar is too ambiguous: " + std::to_string(n) + " alternatives alive at once, over " +
           std::to_string(GrammarLimits::kStacks) + " (the grammar stack limit)";
}

// -inf for every entry not in `allowed` (sorted ids)
void apply_allowed(const std::vector<llama_token>& allowed, float* logits, int32_t n_vocab) {
    size_t j = 0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        if (j < allowed.size() && allowed[j] == i) {
            ++j;
        } else {
            logits[i] = -std::numeric_limits<float>::infinity();
        }
    }
}

}  // namespace

struct MaskCache {
    static constexpr size_t kMaxStates = 4096;
    std::unordered_map<std::string, std::vector<llama_token>> allowed;  // sorted ids
};

Grammar::Grammar(const llama_vocab* vocab, const GrammarSpec& spec, std::shared_ptr<MaskCache> cache)
    : vocab_(vocab), cache_(cache ? std::move(cache) : std::make_shared<MaskCache>()) {
    const std::string err = grammar_error(spec.gbnf);
    if (!err.empty()) throw InvalidArgument("the grammar does not parse: " + err);
    std::vector<const char*> patterns;
    for (const auto& p : spec.trigger_patterns) patterns.push_back(p.c_str());
    try {
        g_.reset(llama_grammar_init_impl(vocab, spec.gbnf.c_str(), "root", spec.lazy, patterns.data(), patterns.size(),
                                         spec.trigger_tokens.data(), spec.trigger_tokens.size()));
    } catch (const std::exception& e) {  // a trigger pattern that is not a regex
        throw InvalidArgument(std::string("the grammar could not be built: ") + e.what());
    }
    if (!g_) throw InvalidArgument("the grammar could not be built (see the log)");
    if (g_->stacks.size() > GrammarLimits::kStacks) throw InvalidArgument(too_ambiguous(g_->stacks.size()));
    index_rules();
    for (llama_token t : spec.prefill) accept(t);
}

Grammar::Grammar(const llama_vocab* vocab, llama_grammar* g, std::shared_ptr<MaskCache> cache)
    : vocab_(vocab), g_(g), cache_(std::move(cache)) {
    index_rules();
}

Grammar::~Grammar() = default;

void Grammar::index_rules() {
    rule_at_.clear();
    for (size_t r = 0; r < g_->rules.size(); ++r) {
        if (!g_->rules[r].empty()) rule_at_.emplace_back(g_->rules[r].data(), static_cast<uint32_t>(r));
    }
    std::sort(rule_at_.begin(), rule_at_.end());
}

bool Grammar::locate(const llama_grammar_element* e, uint32_t& rule, uint32_t& offset) const {
    // the rule holding e: the last one starting at or before it
    auto it =
        std::upper_bound(rule_at_.begin(), rule_at_.end(), std::make_pair(static_cast<const void*>(e), UINT32_MAX));
    if (it == rule_at_.begin()) return false;
    --it;
    rule = it->second;
    offset = static_cast<uint32_t>(e - static_cast<const llama_grammar_element*>(it->first));
    return true;
}

bool Grammar::state_key() {
    if (key_known_ >= 0) return key_known_ == 1;  // the state has not moved since
    key_known_ = 0;
    if (g_->awaiting_trigger) return false;
    key_.clear();
    auto put = [this](uint32_t v) { key_.append(reinterpret_cast<const char*>(&v), sizeof v); };
    put(g_->partial_utf8.value);
    put(static_cast<uint32_t>(g_->partial_utf8.n_remain));
    for (const auto& stack : g_->stacks) {
        put(static_cast<uint32_t>(stack.size()));
        for (const llama_grammar_element* e : stack) {
            uint32_t rule = 0, offset = 0;
            if (!locate(e, rule, offset)) return false;
            put(rule);
            put(offset);
        }
    }
    key_known_ = 1;
    return true;
}

std::unique_ptr<Grammar> Grammar::clone() const {
    // llama_grammar_clone_impl re-points each stack element by searching every rule for
    // it (stacks x elements x rules: minutes for a large grammar): the rules are cloned
    // with no stacks, then this state is taken as assign_state takes it
    llama_grammar_stacks stacks;
    stacks.swap(g_->stacks);
    llama_grammar* copy = nullptr;
    try {
        copy = llama_grammar_clone_impl(*g_);
    } catch (...) {
        g_->stacks.swap(stacks);
        throw;
    }
    g_->stacks.swap(stacks);
    std::unique_ptr<Grammar> out(new Grammar(vocab_, copy, cache_));
    out->assign_state(*this);
    out->set_stop(stop_, stop_data_);
    return out;
}

const std::vector<llama_token>* Grammar::known_allowed() {
    if (!state_key()) return nullptr;
    auto it = cache_->allowed.find(key_);
    return it == cache_->allowed.end() ? nullptr : &it->second;
}

void Grammar::assign_state(const Grammar& other) {
    // the same rules at other addresses: each stack element keeps its rule and offset
    g_->stacks = other.g_->stacks;
    for (auto& stack : g_->stacks) {
        for (auto& e : stack) {
            uint32_t rule = 0, offset = 0;
            other.locate(e, rule, offset);  // e lies in one of other's rules
            e = g_->rules[rule].data() + offset;
        }
    }
    g_->partial_utf8 = other.g_->partial_utf8;
    g_->awaiting_trigger = other.g_->awaiting_trigger;
    g_->trigger_buffer = other.g_->trigger_buffer;
    g_->trigger_buffer_positions = other.g_->trigger_buffer_positions;
    key_known_ = -1;
}

bool Grammar::allows(llama_token t) {
    if (const auto* known = known_allowed()) return std::binary_search(known->begin(), known->end(), t);
    return allows_one(t);
}

void Grammar::apply_to_cur() {
    // a chunk at a time: the stop check may end a long one, as it ends a decode
    constexpr size_t kChunk = 4096;
    for (size_t b = 0; b < cur_.size(); b += kChunk) {
        if (stop_ != nullptr && stop_(stop_data_)) throw Interrupted("the grammar's work was interrupted");
        llama_token_data_array arr{cur_.data() + b, std::min(kChunk, cur_.size() - b), -1, false};
        llama_grammar_apply_impl(*g_, &arr);
    }
}

std::vector<bool> Grammar::allows_each(const std::vector<llama_token>& tokens) {
    cur_.resize(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) cur_[i] = {tokens[i], 0.0f, 0.0f};
    apply_to_cur();
    std::vector<bool> out(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) out[i] = std::isfinite(cur_[i].logit);
    return out;
}

bool Grammar::allows_one(llama_token t) {
    llama_token_data one{t, 0.0f, 0.0f};
    llama_token_data_array arr{&one, 1, -1, false};
    llama_grammar_apply_impl(*g_, &arr);
    return std::isfinite(one.logit);
}

void Grammar::mask(float* logits, int32_t n_vocab) {
    if (g_->awaiting_trigger) return;  // a lazy grammar before its trigger allows everything
    const bool cacheable = state_key();
    auto it = cacheable ? cache_->allowed.find(key_) : cache_->allowed.end();
    if (it == cache_->allowed.end()) {
        // the grammar's verdict on every token (of the state, not of these logits)
        cur_.resize(static_cast<size_t>(n_vocab));
        for (int32_t i = 0; i < n_vocab; ++i) cur_[static_cast<size_t>(i)] = {i, 0.0f, 0.0f};
        apply_to_cur();
        std::vector<llama_token> allowed;
        for (const llama_token_data& d : cur_) {
            if (std::isfinite(d.logit)) allowed.push_back(d.id);
        }
        std::sort(allowed.begin(), allowed.end());
        if (!cacheable) {
            apply_allowed(allowed, logits, n_vocab);
            return;
        }
        if (cache_->allowed.size() >= MaskCache::kMaxStates) cache_->allowed.clear();
        it = cache_->allowed.emplace(key_, std::move(allowed)).first;
    }
    apply_allowed(it->second, logits, n_vocab);
}

void Grammar::accept(llama_token t) {
    // llama.cpp aborts the process on an end-of-generation token the grammar does
    // not allow: refuse it here instead
    if (llama_vocab_is_eog(vocab_, t) && !allows(t)) {
        throw GrammarError("the grammar does not allow the end of generation here");
    }
    key_known_ = -1;
    try {
        llama_grammar_accept_impl(*g_, t);
    } catch (const std::exception& e) {
        throw GrammarError(std::string("the output does not fit the grammar: ") + e.what());
    }
    if (g_->stacks.size() > GrammarLimits::kStacks) throw GrammarError(too_ambiguous(g_->stacks.size()));
}

}  // namespace pydflash
