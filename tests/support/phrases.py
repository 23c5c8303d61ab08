"""The phrase model of the tool-call and reasoning tests: a tiny target whose
vocabulary has whole phrases as single (user-defined) tokens, so a logit_bias makes
the greedy model write a tool call, or reasoning then an answer, deterministically;
its template renders tools and tool calls in the Hermes / Qwen3 way."""

from __future__ import annotations

import dataclasses

import numpy as np

from pydflash import gguf_writers
from support.models import TARGET

SPEC = dataclasses.replace(TARGET, n_vocab=512)  # room for unused tokens to turn into phrases
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THINK = "<think>\nThe user wants the weather.\n</think>\n\n"
PHRASES = {
    "think+call": THINK + CALL,
    "think+answer": THINK + "It is sunny.",
    "call": CALL,
    # reasoning words and the end of reasoning, for multi-step generations
    "w1": " alpha",
    "w2": " beta",
    "end": "\n</think>\n\nDone.",
    # a call to a function the request did not offer
    "badcall": '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>',
}
TOOL_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call><|im_end|>\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'tool' -%}"
    "{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\n' -}}"
    "{%- if message.role == 'assistant' and message.reasoning_content -%}"
    "{{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' -}}"
    "{%- endif -%}"
    "{%- if message.content -%}{{- message.content -}}{%- endif -%}"
    "{%- if message.role == 'assistant' and message.tool_calls -%}"
    "{%- for tc in message.tool_calls -%}"
    "{%- set f = tc.function if tc.function else tc -%}"
    '{{- \'<tool_call>\n{"name": "\' + f.name + \'", "arguments": \' -}}'
    "{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}"
    "{{- '}\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\n\n</think>\n\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

# the same, with reasoning forced open (as Qwen3 thinking-only templates do)
FORCED_TEMPLATE = TOOL_TEMPLATE.replace(
    "{{- '<|im_start|>assistant\n' -}}", "{{- '<|im_start|>assistant\n<think>\n' -}}"
)
assert FORCED_TEMPLATE != TOOL_TEMPLATE


def write_phrase_target(path, template: str) -> dict[str, int]:
    """A tiny qwen3 target whose last unused tokens are PHRASES (user-defined
    tokens detokenize to their text); returns each phrase's token id."""
    s = dataclasses.replace(SPEC, chat_template=template)
    tok = gguf_writers.tokenizer(s.n_vocab)
    tokens, types = list(tok.tokens), list(tok.types)
    ids = {}
    for i, (name, text) in enumerate(PHRASES.items()):
        k = len(tokens) - 1 - i
        assert tokens[k].startswith("<|unused_"), tokens[k]
        tokens[k], types[k] = text, 4
        ids[name] = k
    tok = dataclasses.replace(tok, tokens=tokens, types=types)
    rng = np.random.default_rng(s.seed)
    hp = gguf_writers.Hparams(s.n_ctx, s.n_embd, s.n_layer, s.n_head, s.n_head_kv, s.head_dim, s.n_ff)
    tensors = {"token_embd.weight": gguf_writers.models._rng_tensor(rng, (s.n_vocab, s.n_embd), 1.0)}
    for i in range(s.n_layer):
        layer = gguf_writers.models._attention_layer(rng, i, s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_ff)
        tensors.update(layer)
    tensors["output_norm.weight"] = gguf_writers.models._norm(rng, s.n_embd)
    tensors["output.weight"] = gguf_writers.models._head(rng, s, tok)
    gguf_writers.write_qwen3_gguf(
        path, hp, tok, tensors, name="pydflash tiny phrase target", extra_kv={"tokenizer.chat_template": template}
    )
    return ids
