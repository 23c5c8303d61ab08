#include "grammar_limits.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "common/json.h"
#include "errors.h"

namespace pydflash {

namespace {

using L = GrammarLimits;

// llama.cpp's is_word_char (ASCII letters, digits, '-')
bool is_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; }

uint64_t saturating_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// An upper bound of what llama.cpp's parser would build (llama-grammar.cpp:
// parse_sequence and its handle_repetitions), counted as the text is read.
class GbnfScan {
public:
    explicit GbnfScan(const std::string& s) : s_(s) {}

    // false: a repetition llama.cpp refuses itself (over 2000): nothing after it is parsed
    bool run();

private:
    void symbol(uint64_t n) {
        elements_ = saturating_add(elements_, n);
        last_ = n;
    }
    void check() const;
    // the bytes of a "..." literal or a [...] class starting after its opening character
    uint64_t quoted(char close);
    uint64_t number();
    void space() {
        while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
    }
    // S{m,n} as llama.cpp rewrites it: m copies of S, then n - m (1 without a maximum)
    // optional rules of S and a reference; a repetition of it repeats all of that
    bool repeat(uint64_t min, uint64_t max, bool no_max);
    bool braces();
    void word();

    const std::string& s_;
    size_t i_ = 0;
    int depth_ = 0;
    uint64_t rules_ = 0, elements_ = 0;
    uint64_t last_ = 0;  // elements of the last symbol of the current sequence (what a repetition repeats)
};

void GbnfScan::check() const {
    if (rules_ > L::kRules) {
        throw InvalidArgument("the grammar is too large once its repetitions are expanded: over " +
                              std::to_string(L::kRules) + " rules (the grammar rule limit)");
    }
    if (elements_ > L::kElements) {
        throw InvalidArgument("the grammar is too large once its repetitions are expanded: over " +
                              std::to_string(L::kElements) + " elements (the grammar element limit)");
    }
}

uint64_t GbnfScan::quoted(char close) {
    uint64_t n = 0;
    while (i_ < s_.size() && s_[i_] != close) {
        i_ += s_[i_] == '\\' ? 2 : 1;
        ++n;
    }
    ++i_;
    return n;
}

uint64_t GbnfScan::number() {
    uint64_t v = 0;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
        v = v > 1000000 ? v : v * 10 + static_cast<uint64_t>(s_[i_] - '0');  // saturates past a million
        ++i_;
    }
    return v;
}

bool GbnfScan::repeat(uint64_t min, uint64_t max, bool no_max) {
    constexpr uint64_t kLlamaMax = 2000;  // llama.cpp's MAX_REPETITION_THRESHOLD
    if (min > kLlamaMax) return false;    // llama.cpp refuses it
    if (!no_max && max > kLlamaMax) no_max = true;
    if (!no_max && max < min) {
        throw InvalidArgument("a repetition {" + std::to_string(min) + "," + std::to_string(max) +
                              "} has its maximum below its minimum");
    }
    const uint64_t n_opt = no_max ? 1 : max - min;
    elements_ = saturating_add(elements_, min > 1 ? (min - 1) * last_ : 0);
    elements_ = saturating_add(elements_, n_opt * (last_ + 3) + 1);
    rules_ = saturating_add(rules_, n_opt);
    last_ = last_ * std::max<uint64_t>(min, 1) + 1;
    check();
    return true;
}

bool GbnfScan::braces() {  // after '{': "m}", "m,}" or "m,n}"
    space();
    const uint64_t min = number();
    space();
    if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return repeat(min, min, false);
    }
    if (i_ >= s_.size() || s_[i_] != ',') return true;  // malformed: the parser says so
    ++i_;
    space();
    const bool no_max = i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]));
    const uint64_t max = no_max ? 0 : number();
    space();
    if (i_ < s_.size() && s_[i_] == '}') ++i_;
    return repeat(min, max, no_max);
}

void GbnfScan::word() {
    while (i_ < s_.size() && is_word(s_[i_])) ++i_;
    size_t j = i_;
    while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t')) ++j;
    if (s_.compare(j, 3, "::=") == 0) {  // a rule's definition: the rule and its end
        i_ = j + 3;
        rules_ = saturating_add(rules_, 1);
        elements_ = saturating_add(elements_, 1);
        last_ = 0;
    } else {
        symbol(1);  // a reference
    }
}

bool GbnfScan::run() {
    while (i_ < s_.size()) {
        const char c = s_[i_];
        if (c == '#') {
            while (i_ < s_.size() && s_[i_] != '\n' && s_[i_] != '\r') ++i_;
            continue;
        }
        if (is_word(c)) {
            word();
            check();
            continue;
        }
        ++i_;
        switch (c) {
            case '"': symbol(quoted('"')); break;
            case '[': symbol(quoted(']')); break;
            case '<':  // a token, <[id]> or <name>
                quoted('>');
                symbol(1);
                break;
            case '.': symbol(1); break;
            case '|':
                symbol(1);
                last_ = 0;
                break;
            case '(':
                if (++depth_ > L::kDepth) {
                    throw InvalidArgument("the grammar nests groups more than " + std::to_string(L::kDepth) +
                                          " deep (the grammar depth limit)");
                }
                rules_ = saturating_add(rules_, 1);
                elements_ = saturating_add(elements_, 2);
                last_ = 0;
                break;
            case ')':  // the group is one reference in the sequence around it
                depth_ = std::max(0, depth_ - 1);
                last_ = 1;
                break;
            case '*':
                if (!repeat(0, 0, true)) return false;
                break;
            case '+':
                if (!repeat(1, 0, true)) return false;
                break;
            case '?':
                if (!repeat(0, 1, false)) return false;
                break;
            case '{':
                if (!braces()) return false;
                break;
            case '\n':
            case '\r':
                if (depth_ == 0) last_ = 0;
                break;
            default: break;
        }
        check();
    }
    return true;
}

// the nesting of a regex's groups, escapes and classes skipped
int pattern_depth(const std::string& p) {
    int depth = 0, deepest = 0;
    for (size_t i = 0; i < p.size(); ++i) {
        if (p[i] == '\\') {
            ++i;
        } else if (p[i] == '[') {
            for (++i; i < p.size() && p[i] != ']'; ++i) {
                if (p[i] == '\\') ++i;
            }
        } else if (p[i] == '(') {
            deepest = std::max(deepest, ++depth);
        } else if (p[i] == ')') {
            depth = std::max(0, depth - 1);
        }
    }
    return deepest;
}

void check_schema_entry(const std::string& key, const common_json& value, size_t& refs) {
    if (key.size() > L::kKeyBytes) {
        throw InvalidArgument("a JSON schema's property name is over " + std::to_string(L::kKeyBytes) +
                              " bytes (the schema key limit)");
    }
    if (key == "$ref" && ++refs > L::kRefs) {
        throw InvalidArgument("the JSON schema has over " + std::to_string(L::kRefs) +
                              " $refs (the schema $ref limit)");
    }
    if (key == "pattern" && value.is_string() && pattern_depth(value.get<std::string>()) > L::kPatternDepth) {
        throw InvalidArgument("a JSON schema's pattern nests groups more than " + std::to_string(L::kPatternDepth) +
                              " deep (the pattern depth limit)");
    }
}

}  // namespace

void check_gbnf_limits(const std::string& gbnf) {
    if (gbnf.size() > L::kBytes) {
        throw InvalidArgument("the grammar is " + std::to_string(gbnf.size()) + " bytes, over " +
                              std::to_string(L::kBytes) + " (the grammar size limit)");
    }
    GbnfScan(gbnf).run();
}

void check_json_depth(const std::string& text, const char* what) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') {
                ++i;
            } else if (c == '"') {
                in_string = false;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            if (++depth > L::kJsonDepth) {
                throw InvalidArgument(std::string(what) + " nests objects and arrays more than " +
                                      std::to_string(L::kJsonDepth) + " deep (the JSON depth limit)");
            }
        } else if (c == '}' || c == ']') {
            --depth;
        }
    }
}

void check_schema_limits(const common_json& schema) {
    size_t refs = 0;
    std::vector<const common_json*> todo{&schema};
    while (!todo.empty()) {
        const common_json* node = todo.back();
        todo.pop_back();
        if (node->is_object()) {
            for (const auto& entry : node->items()) {
                check_schema_entry(entry.key(), entry.value(), refs);
                todo.push_back(&entry.value());
            }
        } else if (node->is_array()) {
            for (auto it = node->begin(); it != node->end(); ++it) todo.push_back(&*it);
        }
    }
}

void check_schema_text(const std::string& text) {
    check_json_depth(text, "json_schema");
    if (text.empty()) return;
    const common_json schema = common_json::parse_no_throw(text);
    if (!schema.is_discarded()) check_schema_limits(schema);
}

}  // namespace pydflash
