#include "chat.h"

#include <mutex>

#include "errors.h"
#include "grammar_limits.h"
#include "template_error.h"

// llama.cpp's common library (its chat.h shares our header's name: include by folder)
#include "common/chat.h"
#include "common/log.h"

namespace pydflash {

namespace {

// common/ logs through its own logger, which prints to stderr from a worker
// thread. Every failure we care about comes back as an exception (and then as a
// Python exception), so that logger is paused: its messages are dropped.
void quiet_common_log() {
    static std::once_flag once;
    std::call_once(once, [] { common_log_pause(common_log_main()); });
}

bool is_builtin_name(const std::string& s) {
    if (s.empty() || s.size() > 64) return false;
    for (const auto& n : ChatTemplate::builtin_names()) {
        if (n == s) return true;
    }
    return false;
}

std::vector<common_chat_msg> parse_messages(const std::string& messages_json) {
    common_json j;
    try {
        j = common_json::parse(messages_json);
    } catch (const std::exception& e) {
        throw InvalidArgument(std::string("messages are not valid JSON: ") + e.what());
    }
    if (!j.is_array()) throw InvalidArgument("messages must be a list of message objects");
    try {
        return common_chat_msgs_parse_oaicompat(j);
    } catch (const std::exception& e) {
        throw InvalidArgument(e.what());
    }
}

}  // namespace

void ChatTemplatesDeleter::operator()(common_chat_templates* t) const noexcept { common_chat_templates_free(t); }

ChatTemplate::ChatTemplate(std::shared_ptr<Model> model, const std::string& source, const std::string& bos_token,
                           const std::string& eos_token)
    : model_(std::move(model)) {
    quiet_common_log();
    if (!model_ && source.empty()) {
        throw InvalidArgument("a chat template needs a model or a template source");
    }
    jinja_ = !is_builtin_name(source) || source == "chatml";
    try {
        tmpls_.reset(
            common_chat_templates_init(model_ ? model_->get() : nullptr, source, bos_token, eos_token).release());
    } catch (const std::exception& e) {
        const std::string where = jinja_ ? template_parse_error(source) : "";
        throw ChatTemplateError("chat template does not parse: " + (where.empty() ? std::string(e.what()) : where));
    }
    if (!tmpls_) throw ChatTemplateError("chat template could not be initialised");
    source_ = common_chat_templates_source(tmpls_.get());
    explicit_ = common_chat_templates_was_explicit(tmpls_.get());
}

namespace {

// A template's grammar triggers as the lazy grammar sampler takes them (as
// common/sampling.cpp converts them): regexes, and tokens.
void set_triggers(const std::vector<common_grammar_trigger>& triggers, ChatPrompt& out) {
    for (const auto& t : triggers) {
        switch (t.type) {
            case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: out.grammar_trigger_patterns.push_back(regex_escape(t.value)); break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: out.grammar_trigger_patterns.push_back(t.value); break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
                const std::string& v = t.value;
                std::string anchored = "^$";
                if (!v.empty()) anchored = (v.front() != '^' ? "^" : "") + v + (v.back() != '$' ? "$" : "");
                out.grammar_trigger_patterns.push_back(anchored);
                break;
            }
            case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: out.grammar_trigger_tokens.push_back(t.token); break;
        }
    }
}

}  // namespace

ChatPrompt ChatTemplate::apply(const std::string& messages_json, bool add_generation_prompt, bool enable_thinking,
                               const std::string& tools_json, const std::string& kwargs_json,
                               const std::string& json_schema, const std::string& grammar,
                               const std::string& tool_choice) const {
    // the template and its grammar builder recurse over these: bounded before they read them
    check_json_depth(messages_json, "messages");
    check_json_depth(tools_json, "tools");
    check_json_depth(kwargs_json, "chat template kwargs");
    check_schema_text(json_schema);
    if (!grammar.empty()) check_gbnf_limits(grammar);
    common_chat_templates_inputs in;
    try {
        in.tool_choice = common_chat_tool_choice_parse_oaicompat(tool_choice);
    } catch (const std::exception& e) {
        throw InvalidArgument(std::string(e.what()) + " (auto, none or required)");
    }
    in.json_schema = json_schema;
    in.grammar = grammar;
    in.messages = parse_messages(messages_json);
    in.add_generation_prompt = add_generation_prompt;
    in.use_jinja = jinja_;
    in.enable_thinking = enable_thinking;
    in.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
    if (!tools_json.empty()) {
        try {
            const common_json tools = common_json::parse(tools_json);
            check_schema_limits(tools);  // each tool's parameters are a JSON schema
            in.tools = common_chat_tools_parse_oaicompat(tools);
        } catch (const InvalidArgument&) {
            throw;
        } catch (const std::exception& e) {
            throw InvalidArgument(e.what());
        }
    }
    if (!kwargs_json.empty()) {
        try {
            auto kw = common_json::parse(kwargs_json);
            if (!kw.is_object()) throw InvalidArgument("template kwargs must be a mapping");
            for (auto it = kw.begin(); it != kw.end(); ++it) in.chat_template_kwargs[it.key()] = it.value().dump();
        } catch (const InvalidArgument&) {
            throw;
        } catch (const std::exception& e) {
            throw InvalidArgument(std::string("template kwargs are not valid JSON: ") + e.what());
        }
    }
    // common/chat.cpp writes the enable_thinking flag into the template context itself
    common_chat_params p;
    try {
        p = common_chat_templates_apply(tmpls_.get(), in);
    } catch (const std::exception& e) {
        throw ChatTemplateError(std::string("chat template failed: ") + e.what());
    }
    ChatPrompt out;
    out.prompt = std::move(p.prompt);
    out.additional_stops = std::move(p.additional_stops);
    out.generation_prompt = std::move(p.generation_prompt);
    out.format_id = static_cast<int>(p.format);
    out.format = common_chat_format_name(p.format);
    out.parser = std::move(p.parser);
    out.supports_thinking = p.supports_thinking;
    out.thinking_start_tag = std::move(p.thinking_start_tag);
    out.thinking_end_tags = std::move(p.thinking_end_tags);
    out.grammar = std::move(p.grammar);
    out.grammar_lazy = p.grammar_lazy;
    set_triggers(p.grammar_triggers, out);
    if (model_) out.tokens = model_->tokenize(out.prompt, true, true);
    return out;
}

bool ChatTemplate::supports_thinking() const {
    if (!jinja_) return false;
    try {
        return common_chat_templates_support_enable_thinking(tmpls_.get());
    } catch (const std::exception&) {
        return false;
    }
}

std::vector<std::string> ChatTemplate::builtin_names() {
    int32_t n = llama_chat_builtin_templates(nullptr, 0);
    std::vector<const char*> names(n > 0 ? n : 0);
    if (n > 0) llama_chat_builtin_templates(names.data(), names.size());
    return {names.begin(), names.end()};
}

ChatReply ChatTemplate::parse(const std::string& text, const ChatPrompt& prompt, bool extract_reasoning,
                              bool is_partial) {
    if (prompt.format_id < 0 || prompt.format_id >= COMMON_CHAT_FORMAT_COUNT) {
        throw InvalidArgument("unknown chat format id");
    }
    common_chat_parser_params pp;
    pp.format = static_cast<common_chat_format>(prompt.format_id);
    pp.generation_prompt = prompt.generation_prompt;
    pp.reasoning_format = extract_reasoning ? COMMON_REASONING_FORMAT_DEEPSEEK : COMMON_REASONING_FORMAT_NONE;
    ChatReply out;
    try {
        if (!prompt.parser.empty()) pp.parser.load(prompt.parser);
        common_chat_msg msg = common_chat_parse(text, is_partial, pp);
        out.content = msg.content;
        out.reasoning_content = msg.reasoning_content;
        for (const auto& tc : msg.tool_calls) out.tool_calls.push_back({tc.name, tc.arguments, tc.id});
    } catch (const std::exception& e) {
        throw ChatTemplateError(std::string("reply does not match the template's format: ") + e.what());
    }
    return out;
}

}  // namespace pydflash
