#include "template_error.h"

#include <cstddef>
#include <exception>
#include <vector>

#include "common/jinja/lexer.h"
#include "common/jinja/parser.h"

namespace pydflash {

namespace {

// jinja's positioned errors read "<tag>: <message>\n...<up to 40 bytes each side,
// newlines as U+21B5>...\n<spaces>^": find that window in the source for the offset.
bool window_offset(const std::string& what, const std::string& source, size_t& pos) {
    const size_t nl1 = what.find('\n');
    const size_t nl2 = nl1 == std::string::npos ? nl1 : what.find('\n', nl1 + 1);
    if (nl2 == std::string::npos) return false;
    std::string window = what.substr(nl1 + 1, nl2 - nl1 - 1);
    if (window.size() < 6 || window.compare(0, 3, "...") != 0) return false;
    window = window.substr(3, window.size() - 6);
    const std::string arrow = "\u21b5";
    for (size_t at = window.find(arrow); at != std::string::npos; at = window.find(arrow, at + 1)) {
        window.replace(at, arrow.size(), "\n");
    }
    const size_t caret = what.find('^', nl2);
    const size_t start = source.find(window);
    if (caret == std::string::npos || caret - nl2 - 1 < 3 || start == std::string::npos) return false;
    pos = start + (caret - nl2 - 1 - 3);
    return pos <= source.size();
}

// Errors thrown without a position: the first token whose prefix of the template
// fails with the same message is the one the parser stopped at.
bool token_offset(const jinja::lexer_result& lexed, const std::string& message, size_t& pos) {
    jinja::lexer_result prefix{{}, lexed.source};
    for (const jinja::token& t : lexed.tokens) {
        prefix.tokens.push_back(t);
        try {
            jinja::parse_from_tokens(prefix);
        } catch (const std::exception& e) {
            if (e.what() == message) {
                pos = t.pos;
                return true;
            }
        }
    }
    return false;
}

std::string located(const std::string& source, size_t pos, const std::string& message) {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < pos && i < source.size(); ++i) {
        if (source[i] == '\n') {
            ++line;
            column = 1;
        } else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) {
            ++column;  // characters, not UTF-8 continuation bytes
        }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + message;
}

}  // namespace

std::string template_parse_error(const std::string& source) {
    jinja::lexer_result lexed;
    size_t pos = 0;
    try {
        lexed = jinja::lexer().tokenize(source);
    } catch (const std::exception& e) {
        const std::string what = e.what();
        const std::string message = what.substr(0, what.find('\n'));
        return window_offset(what, source, pos) ? located(source, pos, message) : message;
    }
    try {
        jinja::parse_from_tokens(lexed);
        return "";
    } catch (const jinja::parser_exception& e) {
        const std::string what = e.what();
        const std::string message = what.substr(0, what.find('\n'));
        return window_offset(what, lexed.source, pos) ? located(lexed.source, pos, message) : message;
    } catch (const std::exception& e) {
        const std::string message = e.what();
        return token_offset(lexed, message, pos) ? located(lexed.source, pos, message) : message;
    }
}

}  // namespace pydflash
