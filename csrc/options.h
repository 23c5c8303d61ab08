// The named choices of the options that cross the binding, in one table each
// (llama.cpp's own names where it has them). The core parses with these
// tables and the Python layer reads them (`_core.CHOICES`), so a choice is
// added in one place.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "llama.h"

namespace pydflash {

// Option name -> its allowed values, in the order they are documented.
using ChoiceTable = std::vector<std::pair<std::string, std::vector<std::string>>>;
const ChoiceTable& option_choices();

// "{option} must be one of 'a', 'b', got 'x'" unless `value` is listed.
void check_choice(const std::string& option, const std::string& value);

// Parsers of checked names into llama.cpp's enums; InvalidArgument otherwise.
ggml_type parse_cache_type(const std::string& option, const std::string& name);
llama_flash_attn_type parse_flash_attn(const std::string& name);
llama_split_mode parse_split_mode(const std::string& name);

}  // namespace pydflash
