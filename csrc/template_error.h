// Why a jinja chat template does not parse, and where. llama.cpp rethrows the
// parser's error as a bare std::exception (its message lost), so the template
// is parsed again here for the message and its line and column.
#pragma once

#include <string>

namespace pydflash {

// "line L, column C: <the parser's message>", or "" when `source` parses.
std::string template_parse_error(const std::string& source);

}  // namespace pydflash
