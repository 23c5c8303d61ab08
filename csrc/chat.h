// Chat templates: a model's own template (GGUF tokenizer.chat_template, jinja),
// an explicit jinja source, or one of llama.cpp's built-in named templates,
// applied to OpenAI-style messages through llama.cpp's common/chat (jinja engine
// included); and the template-aware parse of a reply into content / reasoning.
// No Python headers here; llama-common's headers stay in chat.cpp.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model.h"

struct common_chat_templates;

namespace pydflash {

// The prompt a template produced, and what the reply parser needs.
struct ChatPrompt {
    std::string prompt;
    std::vector<std::string> additional_stops;  // stop strings the template asks for
    std::string generation_prompt;              // the assistant prefix the template appended
    std::string format;                         // llama.cpp's name of the reply format
    int format_id = 0;
    std::string parser;  // serialized reply parser (may be empty)
    bool supports_thinking = false;
    std::string thinking_start_tag;
    std::vector<std::string> thinking_end_tags;
    // The output's grammar (tool calls, a JSON schema, a user grammar as the template
    // combines them); lazy: only once a trigger appears (a regex on the output, or a token)
    std::string grammar;
    bool grammar_lazy = false;
    std::vector<std::string> grammar_trigger_patterns;
    std::vector<llama_token> grammar_trigger_tokens;
    // The prompt's token ids as a generation reads it (BOS where the vocabulary asks for
    // it, special tokens parsed), made in the same call so the text need not come back to
    // be tokenized; none when the template has no model.
    std::optional<std::vector<llama_token>> tokens;
};

struct ChatToolCall {
    std::string name;
    std::string arguments;
    std::string id;
};

struct ChatReply {
    std::string content;
    std::string reasoning_content;
    std::vector<ChatToolCall> tool_calls;
};

struct ChatTemplatesDeleter {
    void operator()(common_chat_templates* t) const noexcept;
};

class ChatTemplate {
public:
    // `source`: "" = the model's own template (ChatML when the GGUF has none),
    // a llama.cpp built-in template name (applied without jinja), or jinja source.
    // `model` may be null when `source` is given. Throws ChatTemplateError.
    ChatTemplate(std::shared_ptr<Model> model, const std::string& source, const std::string& bos_token,
                 const std::string& eos_token);

    // `messages_json`: an OpenAI-style JSON array of messages; `tools_json`: "" or a
    // JSON array of tools; `kwargs_json`: "" or a JSON object of extra template variables.
    // Bad messages throw InvalidArgument; a template that fails throws ChatTemplateError.
    // `json_schema` ("" or JSON text) and `grammar` ("" or GBNF) constrain the reply;
    // `tool_choice`: OpenAI's "auto", "none" or "required" (a call is forced from the start).
    // With a model, the result carries the prompt's tokens too (ChatPrompt::tokens).
    ChatPrompt apply(const std::string& messages_json, bool add_generation_prompt, bool enable_thinking,
                     const std::string& tools_json, const std::string& kwargs_json, const std::string& json_schema = "",
                     const std::string& grammar = "", const std::string& tool_choice = "auto") const;

    const std::string& source() const { return source_; }
    bool has_model_template() const { return explicit_; }
    bool uses_jinja() const { return jinja_; }
    bool supports_thinking() const;

    // Names of llama.cpp's built-in (non-jinja) templates.
    static std::vector<std::string> builtin_names();

    // Split a generated reply into content, reasoning and tool calls with the parser
    // that apply() returned. `is_partial`: text may stop mid-way (streaming).
    static ChatReply parse(const std::string& text, const ChatPrompt& prompt, bool extract_reasoning, bool is_partial);

private:
    std::shared_ptr<Model> model_;  // keeps the vocabulary alive
    std::unique_ptr<common_chat_templates, ChatTemplatesDeleter> tmpls_;
    std::string source_;
    bool explicit_ = false;
    bool jinja_ = true;
};

}  // namespace pydflash
