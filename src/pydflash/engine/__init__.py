"""Generations and their scheduling: the layer below `Llama`, above the pair.

A `Generation` holds one request's state (prompt, sampling, text assembly,
results); the `Engine` runs the generations that share a pair, step by step.
"""

from .engine import Engine
from .generation import Generation, GenerationHost, Prompt
from .submission import Submission
from .text import TextAssembler

__all__ = ["Engine", "Generation", "GenerationHost", "Prompt", "Submission", "TextAssembler"]
