"""Training prompts: read from a file (plain text, one per line; JSONL with
OpenAI-style ``messages``; JSONL with ``prompt``), or written by the target
itself (a chat model samples user turns from its template's user prefix, the
"Magpie" technique; a base model samples from BOS), then rendered into token
ids through the target's own chat template, in the reasoning mode it will serve."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ChatTemplateError
from .errors import PromptsFileError

if TYPE_CHECKING:
    from ..llama import Llama

__all__ = ["SELF_PROMPT_CTX", "TrainPrompt", "read_prompts", "render", "self_prompts"]

_SENTINEL = "PYDFLASH-USER-TURN-5c1e"  # stands for the user's text while the template is cut at it
_ROLES = ("system", "user", "assistant", "tool", "developer")
SELF_PROMPT_CTX = 512  # a slot's context for writing a prompt: the template's user prefix and the prompt


@dataclasses.dataclass(frozen=True)
class TrainPrompt:
    """A chat (``messages``) or a raw completion prompt (``text``)."""

    messages: tuple[Mapping[str, Any], ...] | None = None
    text: str | None = None


def read_prompts(path: Path, *, chat: bool) -> list[TrainPrompt]:
    """The file's prompts, refused with a ``PromptsFileError`` naming the first line that does not
    parse. Plain-text lines are user turns of a chat when ``chat`` (the target has a template), else
    raw prompts. A JSONL file is one whose first non-empty line starts with ``{``."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise PromptsFileError(f"{path}: cannot read the prompts file: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise PromptsFileError(f"{path}:{line}: not UTF-8 text") from None
    lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
    if not lines:
        raise PromptsFileError(f"{path}: the prompts file holds no prompt")
    if lines[0][1].lstrip().startswith("{"):
        return [_json_prompt(path, n, ln) for n, ln in lines]
    if chat:
        return [TrainPrompt(messages=({"role": "user", "content": ln.strip()},)) for _, ln in lines]
    return [TrainPrompt(text=ln.strip()) for _, ln in lines]


def _json_prompt(path: Path, n: int, line: str) -> TrainPrompt:
    where = f"{path}:{n}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptsFileError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise PromptsFileError(f"{where}: each line must be a JSON object, not {type(obj).__name__}")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise PromptsFileError(f"{where}: 'messages' must be a non-empty list")
        for m in msgs:
            if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
                raise PromptsFileError(
                    f"{where}: each message needs a 'role' ({', '.join(_ROLES)}) and a string 'content'"
                )
        if msgs[-1]["role"] == "assistant":
            msgs = msgs[:-1]  # the target writes the reply itself
        if not msgs:
            raise PromptsFileError(f"{where}: 'messages' holds only an assistant reply")
        return TrainPrompt(messages=tuple(msgs))
    if isinstance(obj.get("prompt"), str) and obj["prompt"]:
        return TrainPrompt(text=obj["prompt"])
    raise PromptsFileError(f"{where}: a line needs 'messages' (a chat) or 'prompt' (a non-empty string)")


def render(llm: Llama, p: TrainPrompt, *, thinking: bool) -> list[int]:
    """The prompt's token ids: a chat through the target's template with the generation prompt."""
    if p.messages is not None:
        text = llm.apply_chat_template(list(p.messages), enable_thinking=thinking).prompt
        return llm.tokenize(text, add_bos=not text.startswith(_bos_text(llm)), special=True)
    assert p.text is not None
    return llm.tokenize(p.text, special=True)


def _bos_text(llm: Llama) -> str:
    bos = llm.token_bos()
    return llm.detokenize([bos], special=True).decode("utf-8", "replace") if bos >= 0 else "\x00"


def user_prefix(llm: Llama, *, thinking: bool) -> tuple[str, str]:
    """(the template's text before a user message's content, the text right after it), e.g.
    ``"<|im_start|>user\\n"`` and ``"<|im_end|>\\n"``; raises ChatTemplateError when it does not render."""
    full = llm.apply_chat_template(
        [{"role": "user", "content": _SENTINEL}], add_generation_prompt=False, enable_thinking=thinking
    ).prompt
    if full.count(_SENTINEL) != 1:
        raise ChatTemplateError("the chat template does not render a user message's text as given")
    before, after = full.split(_SENTINEL)
    return before, after


def self_prompts(
    llm: Llama, n: int, *, seed: int, first: int, chat: bool, thinking: bool, max_tokens: int = 96
) -> list[TrainPrompt]:
    """Up to ``n`` distinct prompts the target writes itself at temperature 1, the i-th with seed
    (seed, ``first`` + i): user turns cut at the end of the turn for a chat model, texts after BOS
    for a base model. Empty and repeated ones are dropped, so fewer may come back."""
    if chat:
        before, after = user_prefix(llm, thinking=thinking)
        start = llm.tokenize(before, add_bos=not before.startswith(_bos_text(llm)), special=True)
        stop: Sequence[str] = [after.strip()] if after.strip() else []
    else:
        if llm.token_bos() < 0:
            raise ChatTemplateError("a base target without a BOS token cannot write its own prompts: give --prompts")
        start, stop = [llm.token_bos()], []
    subs = [
        llm.submit(start, max_tokens=max_tokens, temperature=1.0, top_p=0.95, seed=_seed(seed, first + i), stop=stop)
        for i in range(n)
    ]
    seen: set[str] = set()
    out: list[TrainPrompt] = []
    for s in subs:
        text = s.result().text.strip()
        if len(text) >= 8 and text not in seen:
            seen.add(text)
            out.append(TrainPrompt(messages=({"role": "user", "content": text},)) if chat else TrainPrompt(text=text))
    return out


def _seed(seed: int, i: int) -> int:
    return (seed * 1_000_003 + i) % (1 << 31)


def prompts_digest(prompts: Sequence[TrainPrompt]) -> str:
    """A stable hash of the prompts (part of the key of the data they make)."""
    import hashlib

    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps({"m": p.messages, "t": p.text}, sort_keys=True).encode())
    return h.hexdigest()[:16]
