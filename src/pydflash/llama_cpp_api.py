"""llama-cpp-python's ``Llama`` methods (``n_ctx()``, ``tokenize(bytes)``,
``eval``/``sample``, ``save_state``, ``create_embedding`` ...), mixed into
``pydflash.Llama`` so that a llama-cpp-python program runs with ``draft=`` added.

``eval``/``sample`` drive sequence 0 of the pair: the tokens ``eval`` took are
``input_ids``, and each call first brings the contexts back to them (the prompt
cache keeps what they already hold), so a generation in between costs only a
re-evaluation, never a wrong token."""

from __future__ import annotations

import dataclasses
import difflib
import os
import random
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, cast, overload

import numpy as np
import numpy.typing as npt

from . import _core
from .config import Grammar, ModelConfig, SamplingConfig, make_grammar
from .errors import PyDFlashError
from .llama_cache import BaseLlamaCache, LlamaState, sequence_state
from .openai.completions import CompletionHost, create_chat_completion, create_completion
from .openai.embeddings import CreateEmbeddingResponse, Vector, embed_texts, embedding_response
from .options import LLAMA_CPP_DEFAULTS

if TYPE_CHECKING:
    from .engine.engine import Engine, HeldSlot
    from .engine.generation import Prompt
    from .openai.types import ChatCompletion, ChatCompletionChunk, Completion, CompletionChunk
    from .pair import ContextPair

__all__ = ["EmbedOutput", "LlamaCppApi", "LlamaCppKeywords", "LlamaState", "llama_cpp_options", "token_list"]
# LlamaState is llama_cache's: named here too, where llama-cpp-python programs find it

_Result = TypeVar("_Result")
_CORE = SamplingConfig()  # the core's defaults, where llama-cpp-python's are the same
# a text's vector, or one per token (pooling "none"); for a list of texts, a list of them
EmbedOutput = Vector | list[Vector] | list[Vector | list[Vector]]


def token_list(tokens: Sequence[int], n_vocab: int) -> list[int]:
    """``tokens`` as a checked list of ids in [0, n_vocab)."""
    if isinstance(tokens, (str, bytes)):
        raise TypeError("expected a sequence of token ids")
    out: list[int] = []
    for t in tokens:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"token ids must be int, got {type(t).__name__}")
        if not 0 <= t < n_vocab:
            raise ValueError(f"token id {t} is out of range [0, {n_vocab})")
        out.append(int(t))
    return out


class LlamaCppApi:
    """llama-cpp-python's names on ``Llama`` (see the module's docstring)."""

    config: ModelConfig
    _engine: Engine | None
    _embedder: _core.Embedder | None = None
    _input_ids: tuple[int, ...] = ()  # what eval() took
    _rng: random.Random | None = None
    _cache: BaseLlamaCache | None = None  # set_cache()

    if TYPE_CHECKING:

        @property
        def core_model(self) -> _core.Model: ...

        @property
        def pair(self) -> ContextPair: ...

        @property
        def model_name(self) -> str: ...

    def _require_open(self) -> None:
        """PyDFlashError when this object is closed."""
        self.core_model  # noqa: B018  (the property raises)

    # -- model facts -------------------------------------------------------------

    def n_ctx(self) -> int:
        """The context of all sequences together (each gets ``n_ctx() // n_parallel``)."""
        return self.config.n_ctx

    def n_vocab(self) -> int:
        return self.core_model.n_vocab

    def n_embd(self) -> int:
        """The target's hidden size (the length of its embeddings)."""
        return self.core_model.n_embd

    def token_bos(self) -> int:
        """The beginning-of-sequence token (-1 when the vocabulary has none)."""
        return self.core_model.bos

    def token_eos(self) -> int:
        """The end-of-sequence token (-1 when the vocabulary has none)."""
        return self.core_model.eos

    # -- vocabulary --------------------------------------------------------------

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of ``text`` (UTF-8 bytes, or str). ``add_bos``: BOS first where
        the vocabulary asks for it; ``special``: special-token text such as
        ``<|im_start|>`` becomes that token instead of plain text."""
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        if not isinstance(text, str):
            raise TypeError(f"text must be bytes or str, not {type(text).__name__}")
        return self.core_model.tokenize(text, bool(add_bos), bool(special))

    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None, special: bool = False
    ) -> bytes:
        """The UTF-8 bytes of ``tokens`` (a token boundary may split a character:
        decode the whole output). ``prev_tokens``: tokens before these, whose text is
        left out; ``special``: special tokens as their text."""
        model = self.core_model
        ids = token_list(tokens, model.n_vocab)
        if not prev_tokens:
            return model.detokenize(ids, False, bool(special))
        prev = token_list(prev_tokens, model.n_vocab)
        head = model.detokenize(prev, False, bool(special))
        whole = model.detokenize(prev + ids, False, bool(special))
        return whole[len(head) :]

    # -- low level: eval / sample ------------------------------------------------

    @contextmanager
    def _sequence0(self) -> Iterator[HeldSlot]:
        """Sequence 0, held against generations, at ``input_ids``."""
        self._require_open()
        assert self._engine is not None
        with self._engine.hold(0) as slot:
            if self._input_ids:
                slot.pair.prefill(self._input_ids, reuse=True)
            else:
                slot.pair.reset()
            yield slot

    @property
    def input_ids(self) -> npt.NDArray[np.intc]:
        """The tokens ``eval`` took since the last ``reset`` (``generate`` and the
        completions keep their own)."""
        return np.array(self._input_ids, dtype=np.intc)

    @property
    def n_tokens(self) -> int:
        return len(self._input_ids)

    def reset(self) -> None:
        """Forget the evaluated tokens (the caches keep them for the next prompt)."""
        self._require_open()
        self._input_ids = ()

    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` after ``input_ids`` (ContextLimitError past the context)."""
        ids = token_list(tokens, self.core_model.n_vocab)
        if not ids:
            return
        before = self._input_ids
        self._input_ids = (*before, *ids)
        try:
            with self._sequence0():
                pass
        except BaseException:
            self._input_ids = before
            raise

    def sample(
        self,
        top_k: int = LLAMA_CPP_DEFAULTS.top_k,
        top_p: float = LLAMA_CPP_DEFAULTS.top_p,
        min_p: float = LLAMA_CPP_DEFAULTS.min_p,
        typical_p: float = _CORE.typical_p,
        temp: float = LLAMA_CPP_DEFAULTS.temperature,
        repeat_penalty: float = _CORE.repeat_penalty,
        frequency_penalty: float = _CORE.frequency_penalty,
        presence_penalty: float = _CORE.presence_penalty,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_eta: float = 0.1,
        mirostat_tau: float = 5.0,
        penalize_nl: bool = True,
        logits_processor: object | None = None,
        grammar: Grammar | str | None = None,
        idx: int | None = None,
    ) -> int:
        """The next token after ``input_ids``, by llama.cpp's sampler chain with these
        options (defaults as llama-cpp-python's; ``temp`` 0 is greedy). It is not
        evaluated: ``eval([token])`` takes it. ``penalize_nl`` is accepted and has no
        effect (llama.cpp dropped it); ``tfs_z``, mirostat, ``logits_processor`` and
        ``idx`` are not supported."""
        del penalize_nl, mirostat_eta, mirostat_tau
        if tfs_z != 1.0:
            raise ValueError("tfs_z is not supported: llama.cpp removed tail-free sampling; leave it at 1.0")
        if mirostat_mode != 0:
            raise ValueError("mirostat_mode is not supported by pydflash: its sampler state cannot follow drafts")
        if logits_processor is not None:
            raise ValueError("logits_processor is not supported: use logit_bias or grammar in generate()")
        if idx is not None:
            raise ValueError("idx is not supported: sample() samples after the last evaluated token")
        if not self._input_ids:
            raise ValueError("nothing to sample from: eval(tokens) first")
        cfg = SamplingConfig.build(
            temperature=temp,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            typical_p=typical_p,
            repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            grammar=make_grammar(grammar, None),
        )
        with self._sequence0() as slot:
            pair = slot.pair
            pair.set_sampling_config(cfg, self._next_seed())
            try:
                step = pair.step(draft_max=0)
            finally:
                pair.set_grammar(None)
        return step.tokens[0]

    @property
    def scores(self) -> npt.NDArray[np.float32]:
        """The target's logits at every evaluated position, (n_tokens, n_vocab)
        (computed when asked, so ``logits_all`` costs nothing until then). Needs
        every sequence idle: the pass uses the whole context."""
        n_vocab = self.core_model.n_vocab
        if not self._input_ids:
            return np.zeros((0, n_vocab), dtype=np.float32)
        assert self._engine is not None
        with self._engine.hold(0):
            if self._engine.busy_slots() - {0}:
                raise PyDFlashError("scores needs every sequence idle (a generation is running)")
            return self.pair.score(self._input_ids)

    # -- state -----------------------------------------------------------------

    def save_state(self) -> LlamaState:
        """The evaluated tokens and both contexts' memory of them."""
        with self._sequence0() as slot, tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "state")
            slot.save(path)
            data = Path(path).read_bytes()
        return LlamaState(
            input_ids=self.input_ids,
            n_tokens=len(self._input_ids),
            llama_state=data,
            llama_state_size=len(data),
            seed=self.config.seed,
        )

    def load_state(self, state: LlamaState) -> None:
        """Continue from ``state`` (``save_state`` of this or another ``Llama`` on the
        same model files and settings; ValueError otherwise)."""
        if not isinstance(state, LlamaState):
            raise TypeError(f"state must be a LlamaState from save_state(), not {type(state).__name__}")
        self._require_open()
        assert self._engine is not None
        with self._engine.hold(0) as slot, tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "state")
            Path(path).write_bytes(state.llama_state)
            slot.load(path)
        self._input_ids = tuple(int(t) for t in state.input_ids)
        self.set_seed(state.seed)

    def set_cache(self, cache: BaseLlamaCache | None) -> None:
        """Keep states in ``cache`` (``LlamaRAMCache``, ``LlamaDiskCache``; None: none), as
        llama-cpp-python: after each completion its sequence's state is saved under its tokens,
        and a generation whose prompt shares a longer prefix with a cached state than with what
        the sequence holds starts from that state. One sequence's (``n_parallel=1``)."""
        if cache is not None and not isinstance(cache, BaseLlamaCache):
            raise TypeError(f"cache must be a LlamaRAMCache or LlamaDiskCache, not {type(cache).__name__}")
        if cache is not None and self.config.n_parallel != 1:
            raise ValueError("set_cache keeps one sequence's states (n_parallel=1); with more, each slot's prompt "
                             "cache serves")  # fmt: skip
        self._cache = cache

    def _save_cached(self) -> None:
        """Sequence 0's state into the cache, under the tokens it holds."""
        cache, engine = self._cache, self._engine
        if cache is not None and engine is not None and not engine.closed:
            state = sequence_state(engine, self.config.seed)
            if state is not None:
                cache[state.input_ids.tolist()] = state

    def _cached(self, out: _Result, stream: bool) -> _Result:
        """A completion's result (a stream: once it ends), its state saved in the cache."""
        if self._cache is None:
            return out
        if not stream:
            self._save_cached()
            return out
        return cast("_Result", self._saved_after(cast("Iterator[Any]", out)))

    def _saved_after(self, chunks: Iterator[Any]) -> Iterator[Any]:
        yield from chunks
        self._save_cached()

    def set_seed(self, seed: int) -> None:
        """The seed of every later sampled call that names none (-1: random each time)."""
        self.config = dataclasses.replace(self.config, seed=seed)
        self._rng = random.Random(seed) if seed >= 0 else None

    def _next_seed(self) -> int:
        return self._rng.getrandbits(63) if self._rng is not None else random.getrandbits(63)

    # -- completions (the OpenAI shapes, typed by stream=) ------------------------

    @overload
    def create_completion(
        self, prompt: Prompt, *args: Any, stream: Literal[False] = False, **kwargs: Any
    ) -> Completion: ...
    @overload
    def create_completion(
        self, prompt: Prompt, *args: Any, stream: Literal[True], **kwargs: Any
    ) -> Iterator[CompletionChunk]: ...
    @overload
    def create_completion(
        self, prompt: Prompt, *args: Any, stream: bool, **kwargs: Any
    ) -> Completion | Iterator[CompletionChunk]: ...

    def create_completion(
        self, prompt: Prompt, *args: Any, stream: bool = False, **kwargs: Any
    ) -> Completion | Iterator[CompletionChunk]:
        """OpenAI-style text completion (``stream=True``: chunks); options and
        defaults as llama-cpp-python's. See ``pydflash.openai.completions.create_completion``."""
        kwargs["stream"] = stream
        return self._cached(create_completion(cast("CompletionHost", self), prompt, *args, **kwargs), stream)

    @overload
    def __call__(self, prompt: Prompt, *args: Any, stream: Literal[False] = False, **kwargs: Any) -> Completion: ...
    @overload
    def __call__(
        self, prompt: Prompt, *args: Any, stream: Literal[True], **kwargs: Any
    ) -> Iterator[CompletionChunk]: ...
    @overload
    def __call__(
        self, prompt: Prompt, *args: Any, stream: bool, **kwargs: Any
    ) -> Completion | Iterator[CompletionChunk]: ...

    def __call__(
        self, prompt: Prompt, *args: Any, stream: bool = False, **kwargs: Any
    ) -> Completion | Iterator[CompletionChunk]:
        """Same as ``create_completion``."""
        return self.create_completion(prompt, *args, stream=stream, **kwargs)

    @overload
    def create_chat_completion(
        self, messages: Sequence[Mapping[str, Any]], *args: Any, stream: Literal[False] = False, **kwargs: Any
    ) -> ChatCompletion: ...
    @overload
    def create_chat_completion(
        self, messages: Sequence[Mapping[str, Any]], *args: Any, stream: Literal[True], **kwargs: Any
    ) -> Iterator[ChatCompletionChunk]: ...
    @overload
    def create_chat_completion(
        self, messages: Sequence[Mapping[str, Any]], *args: Any, stream: bool, **kwargs: Any
    ) -> ChatCompletion | Iterator[ChatCompletionChunk]: ...

    def create_chat_completion(
        self, messages: Sequence[Mapping[str, Any]], *args: Any, stream: bool = False, **kwargs: Any
    ) -> ChatCompletion | Iterator[ChatCompletionChunk]:
        """OpenAI-style chat completion through the model's chat template
        (``stream=True``: chunks). See ``pydflash.openai.completions.create_chat_completion``."""
        kwargs["stream"] = stream
        return self._cached(create_chat_completion(cast("CompletionHost", self), messages, *args, **kwargs), stream)

    # -- embeddings ----------------------------------------------------------------

    def embed(
        self, input: str | list[str], normalize: bool = False, truncate: bool = True, return_count: bool = False
    ) -> EmbedOutput | tuple[EmbedOutput, int]:
        """The target's embedding of ``input`` (a text: one vector; a list of texts:
        one per text), mean-pooled hidden states unless the GGUF names another pooling.
        Needs ``Llama(..., embedding=True)``. ``truncate``: a text longer than the
        embedding context (``n_batch``) is cut, else ContextLimitError."""
        vectors, count = self._embed([input] if isinstance(input, str) else input, normalize, truncate)
        out: EmbedOutput = vectors[0] if isinstance(input, str) else vectors
        return (out, count) if return_count else out

    def _embed(self, texts: Sequence[str], normalize: bool, truncate: bool) -> tuple[list[Vector | list[Vector]], int]:
        emb = self._embedder
        if emb is None:
            self._require_open()
            raise PyDFlashError("create the Llama with embedding=True to compute embeddings")
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise TypeError(f"embedding input must be str or a list of str, not {type(texts).__name__}")
        return embed_texts(
            texts,
            lambda t: self.tokenize(t.encode("utf-8")),
            emb.embed,
            emb.n_ctx,
            pooled=emb.pooling != "none",
            normalize=normalize,
            truncate=truncate,
        )

    def create_embedding(self, input: str | list[str], model: str | None = None) -> CreateEmbeddingResponse:
        """OpenAI-shaped embeddings of ``input`` (see ``embed``)."""
        texts = [input] if isinstance(input, str) else input
        vectors, count = self._embed(texts, normalize=False, truncate=True)
        return embedding_response(vectors, count, model or self.model_name)


class LlamaCppKeywords(TypedDict, total=False):
    """llama-cpp-python's ``Llama(...)`` keywords that pydflash takes besides its own;
    each is honoured, or refused by name with the reason (``llama_cpp_options``)."""

    draft_model: str | os.PathLike[str]  # a DFlash drafter GGUF: the same as draft=
    chat_format: str  # a llama.cpp built-in template name (or llama-cpp-python's spelling of one)
    logits_all: bool  # accepted: ``scores`` holds every evaluated position either way
    use_mmap: bool
    use_mlock: bool
    embedding: bool  # create_embedding()/embed() need it
    n_threads_batch: int | None
    n_ubatch: int
    rope_freq_base: float  # the target's; 0: the model's
    last_n_tokens_size: int  # only llama-cpp-python's default (64): pydflash sets the window per call
    offload_kqv: bool  # False: the KV caches stay in host memory (llama.cpp's -nkvo)
    numa: bool | int  # llama.cpp's NUMA placement: True (distribute) or a ggml_numa_strategy, once per process
    lora_path: str | os.PathLike[str] | None  # only None: LoRA adapters are not supported
    lora_base: str | os.PathLike[str] | None  # only None (it goes with lora_path)
    lora_scale: float  # accepted; it applies to a lora_path only


# llama-cpp-python's chat_format names whose llama.cpp template is named differently
_CHAT_FORMATS = {"llama-2": "llama2", "llama-3": "llama3", "mistral-instruct": "mistral-v1", "qwen": "chatml"}
_PENALTY_LAST_N = _CORE.penalty_last_n


@dataclasses.dataclass(frozen=True)
class LlamaCppOptions:
    """``LlamaCppKeywords`` read: ``ModelConfig`` fields, the drafter's path, the template,
    the NUMA strategy (0: none asked)."""

    config: dict[str, object]
    draft: str | os.PathLike[str] | None
    chat_template: str | None
    numa: int = 0

    def apply_numa(self) -> None:
        """Set the NUMA placement asked for (once per process, as llama.cpp allows: a later,
        different one is warned about and changes nothing)."""
        if self.numa:
            in_force = _core.init_numa(self.numa)
            if in_force != self.numa:
                warnings.warn(f"numa={self.numa} ignored: this process already placed memory with strategy "
                              f"{in_force} (llama.cpp sets it once)", stacklevel=3)  # fmt: skip


def _numa(value: object) -> int:
    """llama-cpp-python's ``numa``: a bool (True: distribute) or a ggml_numa_strategy int."""
    if isinstance(value, bool):
        return 1 if value else 0
    if not isinstance(value, int):
        raise TypeError(f"numa must be a bool or an int (a ggml_numa_strategy), not {type(value).__name__}")
    if not 0 <= value <= 4:
        raise ValueError(f"numa must be a bool or a ggml_numa_strategy in [0, 4], got {value}")
    return value


def _check_lora(kw: Mapping[str, object]) -> None:
    """llama-cpp-python's LoRA keywords: accepted as None (its default), refused by name otherwise."""
    for name in ("lora_path", "lora_base"):
        if kw.get(name) is not None:
            raise ValueError(
                f"{name}={kw[name]!r}: LoRA adapters are not supported by pydflash (merge the adapter into the "
                "model, e.g. with llama.cpp's llama-export-lora, and load the merged GGUF)"
            )
    scale = kw.get("lora_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"lora_scale must be a number, not {type(scale).__name__}")


def llama_cpp_options(
    kw: Mapping[str, object], draft: str | os.PathLike[str] | None, chat_template: str | None
) -> LlamaCppOptions:
    """Check and map llama-cpp-python's keywords (TypeError for an unknown one), beside
    pydflash's ``draft`` and ``chat_template`` that two of them name again."""
    known = LlamaCppKeywords.__annotations__
    for name in kw:
        if name not in known:
            close = difflib.get_close_matches(name, [*known, *_LLAMA_KEYWORDS], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"Llama() got an unexpected keyword argument {name!r}{hint}")
    config: dict[str, object] = {}
    _check_lora(kw)
    for name in ("use_mmap", "use_mlock", "embedding", "n_threads_batch", "n_ubatch", "rope_freq_base", "offload_kqv"):
        if name in kw:
            config[name] = kw[name]
    if "logits_all" in kw and not isinstance(kw["logits_all"], bool):
        raise TypeError(f"logits_all must be a bool, not {type(kw['logits_all']).__name__}")
    last_n = kw.get("last_n_tokens_size", _PENALTY_LAST_N)
    if last_n != _PENALTY_LAST_N:
        raise ValueError(
            f"last_n_tokens_size={last_n!r} is not supported: pydflash sets the repeat-penalty window per "
            "call; pass penalty_last_n= to generate() or repeat_last_n to the server instead"
        )
    model = kw.get("draft_model")
    if model is not None:
        if not isinstance(model, (str, os.PathLike)):
            raise TypeError(
                f"draft_model must be the path of a DFlash drafter GGUF, not {type(model).__name__} (for "
                "llama-cpp-python's prompt-lookup drafting, use speculative=['ngram-simple'])"
            )
        if draft is not None:
            raise TypeError("give draft= or draft_model= (its llama-cpp-python name), not both")
        draft = model
    fmt = kw.get("chat_format")
    if fmt is not None:
        if not isinstance(fmt, str):
            raise TypeError(f"chat_format must be a str, not {type(fmt).__name__}")
        fmt = _CHAT_FORMATS.get(fmt, fmt)
        names = _core.ChatTemplate.builtin_names()
        if fmt not in names:
            raise ValueError(
                f"chat_format {kw['chat_format']!r} is not a llama.cpp template; one of: {', '.join(names)}"
            )
        if chat_template is not None:
            raise ValueError("give chat_template or chat_format, not both")
        chat_template = fmt
    return LlamaCppOptions(config, draft, chat_template, _numa(kw.get("numa", False)))


# pydflash's own Llama keywords, for the "did you mean" of a misspelt one
_LLAMA_KEYWORDS = [f.name for f in dataclasses.fields(ModelConfig)] + ["draft", "verbose", "chat_template"]
