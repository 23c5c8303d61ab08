"""OpenAI's shapes of token log-probabilities, from the generation's ``TokenLogprob``s:
the completions API's parallel lists and the chat API's ``content`` entries."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..results import TokenLogprob
from .types import ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs

__all__ = ["chat_logprobs", "completion_logprobs"]

Piece = Callable[[int], bytes]


def _text(piece: Piece, token: int) -> str:
    # a token may end inside a UTF-8 character: its text shows U+FFFD, its bytes are exact
    return piece(token).decode("utf-8", errors="replace")


def completion_logprobs(piece: Piece, lps: Sequence[TokenLogprob], offset: int) -> CompletionLogprobs:
    """The completions API's ``logprobs``; ``offset``: characters of text before the first token."""
    out: CompletionLogprobs = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for lp in lps:
        text = _text(piece, lp.token)
        out["tokens"].append(text)
        out["token_logprobs"].append(lp.logprob)
        out["top_logprobs"].append({_text(piece, t): v for t, v in lp.top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def _top(piece: Piece, token: int, logprob: float) -> ChatTopLogprob:
    b = piece(token)
    return {"token": b.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(b)}


def chat_logprobs(piece: Piece, lps: Sequence[TokenLogprob]) -> ChatLogprobs:
    """The chat API's ``logprobs``: one ``content`` entry per token."""
    content: list[ChatTokenLogprob] = []
    for lp in lps:
        entry = _top(piece, lp.token, lp.logprob)
        content.append(
            {
                "token": entry["token"],
                "logprob": entry["logprob"],
                "bytes": entry["bytes"],
                "top_logprobs": [_top(piece, t, v) for t, v in lp.top],
            }
        )
    return {"content": content}
