// Bounds on what a grammar, a JSON schema or a template's JSON input may ask of
// llama.cpp, checked BEFORE llama.cpp reads it. llama.cpp's GBNF parser recurses
// once per nested group, its left-recursion check once per chained rule, and its
// JSON-schema converter once per nested schema, $ref hop and property-name
// character: deep enough input overflows the stack. Its repetitions multiply
// ("a"{0,1999} is 1999 rules), and a maximum below the minimum ({5,2}) makes it
// generate rules until memory runs out. These scans are iterative and linear in
// the input; each failure is an InvalidArgument that names the limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

class common_json;

namespace pydflash {

struct GrammarLimits {
    static constexpr size_t kBytes = 1 << 20;       // GBNF text
    static constexpr int kDepth = 64;               // nested groups ( ... )
    static constexpr uint64_t kRules = 16384;       // rules once repetitions are expanded
    static constexpr uint64_t kElements = 1 << 20;  // rule elements once expanded
    static constexpr size_t kStacks = 256;          // parse stacks (alternatives alive at once)
    static constexpr int kJsonDepth = 100;          // nested objects/arrays of a schema, tools, messages
    static constexpr size_t kKeyBytes = 1024;       // a JSON schema's property name
    static constexpr size_t kRefs = 1000;           // a JSON schema's $refs
    static constexpr int kPatternDepth = 64;        // nested groups of a schema's regex pattern
};

// InvalidArgument when `gbnf` is over a GrammarLimits bound (nothing is parsed).
void check_gbnf_limits(const std::string& gbnf);

// InvalidArgument when JSON text nests deeper than kJsonDepth (`what` names it).
void check_json_depth(const std::string& text, const char* what);

// InvalidArgument when a parsed JSON schema is over a bound: property names,
// $refs, regex nesting (check_json_depth first: the walk is iterative, the parse
// of a deep text is not what this guards).
void check_schema_limits(const common_json& schema);

// Both checks of a schema given as JSON text ("" or text that does not parse passes:
// whoever parses it says why).
void check_schema_text(const std::string& text);

}  // namespace pydflash
