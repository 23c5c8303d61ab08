"""Requests and their scheduling: the layer below `Llama`, above the pair.

A `Request` is one generation's immutable request; the `Engine` runs the requests
that share a pair, step by step, and sends each one's raw step results to its
`RequestHandle`; a `Generation` is the reader's side: the output processor that
makes text, stop-string hits, logprobs and results of them (`TextAssembler`).
"""

from .channel import RequestHandle
from .engine import Engine
from .generation import Generation, GenerationHost, Prompt
from .request import Request
from .submission import Submission
from .text import TextAssembler

__all__ = [
    "Engine",
    "Generation",
    "GenerationHost",
    "Prompt",
    "Request",
    "RequestHandle",
    "Submission",
    "TextAssembler",
]
