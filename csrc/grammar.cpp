#include "grammar.h"

#include <cmath>
#include <exception>
#include <limits>

#include "common/json-schema-to-grammar.h"
#include "common/json.h"
#include "errors.h"
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
    common_json schema;
    try {
        schema = common_json::parse(schema_json);
    } catch (const std::exception& e) {
        throw InvalidArgument(std::string("json_schema is not valid JSON: ") + e.what());
    }
    try {
        return json_schema_to_grammar(schema);
    } catch (const std::exception& e) {
        throw InvalidArgument(std::string("json_schema cannot be converted to a grammar: ") + e.what());
    }
}

Grammar::Grammar(const llama_vocab* vocab, const GrammarSpec& spec) : vocab_(vocab) {
    const std::string err = grammar_error(spec.gbnf);
    if (!err.empty()) throw InvalidArgument("the grammar does not parse: " + err);
    if (spec.lazy) {
        std::vector<const char*> patterns;
        for (const auto& p : spec.trigger_patterns) patterns.push_back(p.c_str());
        smpl_.reset(llama_sampler_init_grammar_lazy_patterns(vocab, spec.gbnf.c_str(), "root", patterns.data(),
                                                             patterns.size(), spec.trigger_tokens.data(),
                                                             spec.trigger_tokens.size()));
    } else {
        smpl_.reset(llama_sampler_init_grammar(vocab, spec.gbnf.c_str(), "root"));
    }
    if (!smpl_) throw InvalidArgument("the grammar could not be built (see the log)");
    for (llama_token t : spec.prefill) accept(t);
}

std::unique_ptr<Grammar> Grammar::clone() const {
    return std::unique_ptr<Grammar>(new Grammar(vocab_, llama_sampler_clone(smpl_.get())));
}

bool Grammar::allows(llama_token t) {
    llama_token_data one{t, 0.0f, 0.0f};
    llama_token_data_array arr{&one, 1, -1, false};
    llama_sampler_apply(smpl_.get(), &arr);
    return std::isfinite(one.logit);
}

void Grammar::mask(float* logits, int32_t n_vocab) {
    cur_.resize(static_cast<size_t>(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) cur_[static_cast<size_t>(i)] = {i, logits[i], 0.0f};
    llama_token_data_array arr{cur_.data(), cur_.size(), -1, false};
    llama_sampler_apply(smpl_.get(), &arr);
    // the grammar sampler edits logits in place and keeps the order
    for (size_t i = 0; i < arr.size; ++i) logits[arr.data[i].id] = arr.data[i].logit;
}

void Grammar::accept(llama_token t) {
    // llama.cpp aborts the process on an end-of-generation token the grammar does
    // not allow: refuse it here instead
    if (llama_vocab_is_eog(vocab_, t) && !allows(t)) {
        throw GrammarError("the grammar does not allow the end of generation here");
    }
    try {
        llama_sampler_accept(smpl_.get(), t);
    } catch (const std::exception& e) {
        throw GrammarError(std::string("the output does not fit the grammar: ") + e.what());
    }
}

}  // namespace pydflash
