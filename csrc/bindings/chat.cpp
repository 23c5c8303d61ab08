// Chat templates (csrc/chat.h): apply a template to JSON messages, parse a reply.
#include "../chat.h"  // ours, not llama.cpp's common/chat.h

#include <pybind11/stl.h>

#include "bindings.h"

namespace py = pybind11;

namespace pydflash::bindings {

namespace {

py::dict prompt_to_dict(const ChatPrompt& p) {
    py::dict d;
    d["prompt"] = p.prompt;
    d["additional_stops"] = p.additional_stops;
    d["generation_prompt"] = p.generation_prompt;
    d["format"] = p.format;
    d["format_id"] = p.format_id;
    d["parser"] = p.parser;
    d["supports_thinking"] = p.supports_thinking;
    d["thinking_start_tag"] = p.thinking_start_tag;
    d["thinking_end_tags"] = p.thinking_end_tags;
    d["grammar"] = p.grammar;
    d["grammar_lazy"] = p.grammar_lazy;
    d["grammar_trigger_patterns"] = p.grammar_trigger_patterns;
    d["grammar_trigger_tokens"] = p.grammar_trigger_tokens;
    d["tokens"] = p.tokens;  // None without a model
    return d;
}

}  // namespace

void register_chat(py::module_& m) {
    py::class_<ChatTemplate, std::shared_ptr<ChatTemplate>>(m, "ChatTemplate")
        .def(py::init([](std::shared_ptr<Model> model, const std::string& source, const std::string& bos,
                         const std::string& eos) {
                 py::gil_scoped_release nogil;
                 return std::make_shared<ChatTemplate>(std::move(model), source, bos, eos);
             }),
             py::arg("model").none(true), py::arg("source") = "", py::arg("bos_token") = "", py::arg("eos_token") = "")
        .def(
            "apply",
            [](const ChatTemplate& t, const std::string& messages_json, bool add_generation_prompt,
               bool enable_thinking, const std::string& tools_json, const std::string& kwargs_json,
               const std::string& json_schema, const std::string& grammar, const std::string& tool_choice) {
                ChatPrompt p;
                {
                    py::gil_scoped_release nogil;
                    p = t.apply(messages_json, add_generation_prompt, enable_thinking, tools_json, kwargs_json,
                                json_schema, grammar, tool_choice);
                }
                return prompt_to_dict(p);
            },
            py::arg("messages_json"), py::arg("add_generation_prompt") = true, py::arg("enable_thinking") = true,
            py::arg("tools_json") = "", py::arg("kwargs_json") = "", py::arg("json_schema") = "",
            py::arg("grammar") = "", py::arg("tool_choice") = "auto")
        .def_property_readonly("source", &ChatTemplate::source)
        .def_property_readonly("has_model_template", &ChatTemplate::has_model_template)
        .def_property_readonly("uses_jinja", &ChatTemplate::uses_jinja)
        .def_property_readonly("supports_thinking",
                               [](const ChatTemplate& t) {
                                   py::gil_scoped_release nogil;
                                   return t.supports_thinking();
                               })
        .def_static("builtin_names", &ChatTemplate::builtin_names)
        .def_static(
            "parse",
            [](const std::string& text, int format_id, const std::string& generation_prompt, const std::string& parser,
               bool extract_reasoning, bool is_partial) {
                ChatPrompt p;
                p.format_id = format_id;
                p.generation_prompt = generation_prompt;
                p.parser = parser;
                ChatReply r;
                {
                    py::gil_scoped_release nogil;
                    r = ChatTemplate::parse(text, p, extract_reasoning, is_partial);
                }
                py::list calls;
                for (const auto& c : r.tool_calls) calls.append(py::make_tuple(c.name, c.arguments, c.id));
                py::dict d;
                d["content"] = r.content;
                d["reasoning_content"] = r.reasoning_content;
                d["tool_calls"] = calls;
                return d;
            },
            py::arg("text"), py::arg("format_id"), py::arg("generation_prompt") = "", py::arg("parser") = "",
            py::arg("extract_reasoning") = true, py::arg("is_partial") = false);
}

}  // namespace pydflash::bindings
