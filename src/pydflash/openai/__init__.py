"""OpenAI-shaped completions on top of generations: chat templates, the typed
response dicts, logprobs and structured output (grammar / JSON schema)."""

from .completions import create_chat_completion, create_completion

__all__ = ["create_chat_completion", "create_completion"]
