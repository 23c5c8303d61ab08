"""``Llama``: a GGUF target model, optionally with a DFlash drafter, in this
process."""

from __future__ import annotations

import dataclasses
import difflib
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import _core, _logging
from .config import GenerateOptions, ModelConfig, NgramConfig, SamplingConfig, Unpack, speculative_types
from .engine.channel import RequestHandle
from .engine.engine import Engine
from .engine.generation import Generation, Prompt
from .engine.request import Request, make_request
from .engine.submission import Submission
from .errors import PyDFlashError
from .fit import model_context
from .llama_cache import BaseLlamaCache, load_longest_prefix
from .llama_cpp_api import LlamaCppApi, LlamaCppKeywords, llama_cpp_options, token_list
from .openai.chat import ChatTemplate
from .pair import ContextPair
from .results import GenerationResult, MemoryReport, StreamStep

if TYPE_CHECKING:
    from .openai.chat import ChatPrompt

__all__ = ["Llama", "Prompt"]
# the core's defaults, shown in help(Llama)
_DEFAULTS = ModelConfig()
_SAMPLING = SamplingConfig()


class Llama(LlamaCppApi):
    """A target model and an optional DFlash drafter loaded into one process.

    >>> llm = Llama("target.gguf", draft="drafter.gguf")
    >>> res = llm.generate("def fib(n):", max_tokens=64)
    >>> res.text, res.stats.mean_accepted_length

    ``draft=None`` decodes with the target alone (the baseline; same API and
    stats). At temperature 0 the output with a drafter equals the target's
    own greedy output, token for token.

    llama-cpp-python's API is here too (``LlamaCppApi``): ``Llama(model_path=...,
    draft_model=...)``, its constructor keywords (``LlamaCppKeywords``), ``n_ctx()``,
    ``tokenize(bytes)``, ``eval``/``sample``, ``save_state``, ``create_embedding``;
    ``generate`` keeps pydflash's meaning.

    ``rollback`` says how rejected draft tokens leave the target's memory:
    "auto" picks "kv-trim" for attention-only targets, "recurrent-planes" for
    hybrid targets whose llama.cpp architecture supports partial rollback
    (qwen35, qwen35moe: block_size - 1 extra state planes) and "checkpoint"
    for the other recurrent/hybrid targets (e.g. qwen3next). "checkpoint" can
    also be forced on a qwen35 target to save the planes' memory, at the cost
    of a replay pass after each partial acceptance.

    ``n_parallel`` sequences decode together (llama.cpp's ``-np``): calls from
    several threads (``generate``, ``stream``, the completions, the server) and
    ``submit``/``generate_batch`` run at once, each in its own sequence slot,
    one batched speculative step for all of them; ``n_ctx`` is shared, each
    sequence getting ``n_ctx // n_parallel`` tokens. With fewer slots than
    generations, the rest wait their turn.
    """

    _asleep: tuple[str, str | None] | None = None  # sleep(): the files wake() reloads

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        draft: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = _DEFAULTS.n_ctx,
        n_parallel: int = _DEFAULTS.n_parallel,
        kv_unified: bool = False,
        n_gpu_layers: int = _DEFAULTS.n_gpu_layers,
        draft_n_gpu_layers: int | None = None,
        main_gpu: int = _DEFAULTS.main_gpu,
        split_mode: str = _DEFAULTS.split_mode,
        tensor_split: Sequence[float] | None = (),
        rpc_servers: str | Sequence[str] = (),
        flash_attn: bool | str = _DEFAULTS.flash_attn,
        type_k: str = _DEFAULTS.type_k,
        type_v: str = _DEFAULTS.type_v,
        draft_type_k: str = _DEFAULTS.draft_type_k,
        draft_type_v: str = _DEFAULTS.draft_type_v,
        draft_window: int | None = None,
        n_threads: int | None = None,
        draft_max: int | None = None,
        draft_adaptive: bool = _DEFAULTS.draft_adaptive,
        seed: int = _DEFAULTS.seed,
        n_batch: int = _DEFAULTS.n_batch,
        rollback: str = _DEFAULTS.rollback,
        speculative: str | Sequence[str] | None = None,
        ngram: NgramConfig | None = None,
        verbose: bool = False,
        chat_template: str | None = None,
        **llama_cpp: Unpack[LlamaCppKeywords],
    ):
        """Options: see ``ModelConfig`` (``n_ctx=0``: the model's own context; ``n_gpu_layers`` -1: all layers;
        the KV caches, the draft length (``draft_max`` None: chosen each step), ``speculative``: llama.cpp's
        ``--spec-type`` list); ``seed`` -1: random; llama-cpp-python's keywords too (``LlamaCppKeywords``)."""
        self._cache: BaseLlamaCache | None = None  # set_cache()
        self._target: _core.Model | None = None
        self._draft: _core.Model | None = None
        compat = llama_cpp_options(llama_cpp, draft, chat_template)
        draft, chat_template = compat.draft, compat.chat_template
        # ModelConfig normalises (with typed errors) tensor_split, rpc_servers "a:1,b:2", a bool flash_attn
        self.config = ModelConfig(
            n_ctx=n_ctx,
            n_parallel=n_parallel,
            kv_unified=kv_unified,
            n_batch=n_batch,
            n_gpu_layers=n_gpu_layers,
            draft_n_gpu_layers=draft_n_gpu_layers,
            main_gpu=main_gpu,
            split_mode=split_mode,
            tensor_split=tensor_split or (),  # type: ignore[arg-type]  # normalised by ModelConfig (above)
            rpc_servers=rpc_servers,  # type: ignore[arg-type]  # normalised by ModelConfig (above)
            flash_attn=flash_attn,  # type: ignore[arg-type]  # normalised by ModelConfig (above)
            type_k=type_k,
            type_v=type_v,
            draft_type_k=draft_type_k,
            draft_type_v=draft_type_v,
            draft_window=draft_window,
            n_threads=n_threads,
            draft_max=draft_max,
            draft_adaptive=draft_adaptive,
            seed=seed,
            rollback=rollback,
            speculative=speculative_types(speculative),
            ngram=ngram or NgramConfig(),
            **compat.config,  # type: ignore[arg-type]  # checked by ModelConfig (above)
        )
        self.set_seed(seed)
        _logging.set_verbose(verbose)
        compat.apply_numa()
        self._engine: Engine | None = None
        self._chat_template_source = chat_template  # None: the GGUF's own (ChatML if none)
        self._chat_template: ChatTemplate | None = None
        self._start(model_path, draft)

    def _start(self, model_path: str | os.PathLike[str], draft: str | os.PathLike[str] | None) -> None:
        """Load both models, and the engine that makes their contexts and owns them
        (``__init__`` and ``wake()``)."""
        self._engine = self._load(model_path, draft)
        self._pair = self._engine.pair
        # an object dropped without close(), or alive at exit: its engine thread ends (the
        # pair is freed with the last reference to it: a ContextPair from .pair may outlive it)
        weakref.finalize(self, self._engine.close, False)

    def _load(self, model_path: str | os.PathLike[str], draft: str | os.PathLike[str] | None) -> Engine:
        """Both models and the engine over their contexts (llama.cpp's log flushed either way)."""
        cfg = self.config
        try:
            self._target = _core.Model.load(os.fspath(model_path), cfg.model_params("target"), "target")
            if cfg.n_ctx == 0:  # the model's own context (llama.cpp's -c 0)
                self.config = cfg = dataclasses.replace(cfg, n_ctx=model_context(self._target))
            if draft is not None:
                self._draft = _core.Model.load_drafter(os.fspath(draft), cfg.model_params("drafter"))
            engine = Engine(self._target, self._draft, cfg)
            if cfg.embedding:
                self._embedder = _core.Embedder(self._target, min(cfg.n_ctx, cfg.n_batch), cfg.n_threads or 0)
            return engine
        finally:
            _logging.flush()

    # -- lifecycle -----------------------------------------------------------

    def sleep(self) -> None:
        """Free both models and their contexts, as ``close()`` does, but keep what
        reloads them: ``wake()`` loads them again with the same options (llama-server's
        ``--sleep-idle-seconds``). Until then the object reads as closed. Idempotent."""
        if self.closed:
            return
        files = (self.model_path, self.draft_path)
        self.close()
        self._chat_template = None  # parsed against the freed model
        self._asleep = files

    def wake(self) -> None:
        """Load again what ``sleep()`` freed (nothing when the object is awake or closed)."""
        if self._asleep is None:
            return
        model_path, draft = self._asleep
        self._start(model_path, draft)
        self._asleep = None

    @property
    def sleeping(self) -> bool:
        """Whether ``sleep()`` freed the models and ``wake()`` has not reloaded them."""
        return self._asleep is not None

    def close(self) -> None:
        """Free both contexts and models now; generations still waiting or running
        fail with PyDFlashError. Idempotent."""
        self._asleep = None  # closed for good: nothing to wake
        if self._engine is not None:
            self._engine.close()  # and the pair: the engine owns it
        self._target = None
        self._draft = None
        self._embedder = None

    def interrupt(self) -> None:
        """Stop the running decode: every generation in it (all running sequences)
        raises GenerationInterrupted within one graph node, and the caches are
        reset. The object stays usable. To stop one generation, cancel it
        (``Submission.cancel()``, or leave its stream)."""
        if self._engine is not None:
            self._engine.interrupt()

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has freed the models and contexts."""
        return self._engine is None or self._engine.closed

    def _model(self) -> _core.Model:
        if self._target is None:
            raise PyDFlashError("this Llama object is closed")
        return self._target

    # -- model facts ---------------------------------------------------------

    @property
    def core_model(self) -> _core.Model:
        """The target's loaded ``_core.Model`` (vocabulary, ``token_to_piece``,
        ``is_eog``, metadata). PyDFlashError when this object is closed."""
        return self._model()

    @property
    def model_path(self) -> str:
        """The target GGUF's path, as loaded."""
        return self._model().path

    @property
    def draft_path(self) -> str | None:
        """The drafter GGUF's path, as loaded (None without a drafter)."""
        self._model()
        return self._draft.path if self._draft is not None else None

    @property
    def model_name(self) -> str:
        """The target GGUF's file name: the default model id of completions and the server."""
        return os.path.basename(self.model_path)

    @property
    def pair(self) -> ContextPair:
        """The low-level step-by-step API on this model's contexts."""
        self._model()
        return self._pair

    @property
    def n_parallel(self) -> int:
        """Sequences that decode together."""
        return self.config.n_parallel

    @property
    def n_ctx_slot(self) -> int:
        """One sequence's context: ``n_ctx // n_parallel``, ``n_ctx`` with ``kv_unified``
        (llama-server's n_ctx_slot)."""
        return self.pair.n_ctx

    @property
    def has_draft(self) -> bool:
        """Whether a drafter file was loaded (``draft=``)."""
        return self._draft is not None

    @property
    def drafter_kind(self) -> str:
        """ "dflash", "dflash2", "dspark" or "mtp" ("" without one); see ContextPair.drafter_description."""
        return self.pair.drafter_kind

    @property
    def rollback(self) -> str:
        """How rejected draft tokens leave the target: "kv-trim",
        "recurrent-planes" or "checkpoint" (see the class docstring)."""
        return self.pair.rollback

    @property
    def metadata(self) -> dict[str, str]:
        """The target GGUF's metadata, values as text (as llama-cpp-python's ``metadata``)."""
        return dict(self._model().metadata)

    @property
    def draft_metadata(self) -> dict[str, str]:
        """The drafter GGUF's metadata, values as text ({} without a drafter)."""
        return dict(self._draft.metadata) if self._draft is not None else {}

    def memory(self) -> MemoryReport:
        """llama.cpp's memory breakdown of both contexts: model, context (KV
        cache) and compute bytes per device, for the target and the drafter."""
        self._model()
        assert self._engine is not None
        return self._engine.memory()

    # -- slots -------------------------------------------------------------------

    def save_slot(self, slot: int, path: str | os.PathLike[str]) -> None:
        """Write sequence slot ``slot``'s state (its tokens and both contexts' memory
        of them: the target's KV cache and recurrent state, the drafter's features)
        to ``path``, as llama-server's slot save. SlotBusyError while a generation
        uses the slot (load_slot and erase_slot too)."""
        seq = self._slot_index(slot)
        assert self._engine is not None
        self._engine.save_slot(seq, os.fspath(path))

    def load_slot(self, slot: int, path: str | os.PathLike[str]) -> None:
        """Replace slot ``slot`` with a state ``save_slot`` wrote, from this or another
        ``Llama`` on the same model files and settings (ValueError otherwise, before
        the slot is touched). A generation whose prompt extends the saved tokens continues
        from them (``cache_prompt``): its time to first token is that of the new tokens."""
        seq = self._slot_index(slot)
        assert self._engine is not None
        self._engine.load_slot(seq, os.fspath(path))

    def erase_slot(self, slot: int) -> int:
        """Forget slot ``slot``'s cached tokens (both contexts); returns how many it held."""
        seq = self._slot_index(slot)
        assert self._engine is not None
        return self._engine.erase_slot(seq)

    def slots(self) -> list[dict[str, int | bool]]:
        """Each sequence slot: ``id``, ``n_ctx`` (its context), ``is_processing`` (a
        generation holds it) and ``n_tokens`` (tokens it holds: the prompt cache)."""
        self._model()
        engine = self._engine
        assert engine is not None
        busy = engine.busy_slots()
        return [
            {"id": i, "n_ctx": self.n_ctx_slot, "is_processing": i in busy, "n_tokens": len(engine.slot_tokens(i))}
            for i in range(self.n_parallel)
        ]

    def _slot_index(self, slot: int) -> int:
        self._model()
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.n_parallel:
            raise ValueError(f"slot must be an int in [0, {self.n_parallel}), got {slot!r}")
        return slot

    # -- generation ----------------------------------------------------------

    def generate(
        self,
        prompt: Prompt,
        max_tokens: int | None = _SAMPLING.max_tokens,
        temperature: float = _SAMPLING.temperature,
        top_k: int = _SAMPLING.top_k,
        top_p: float = _SAMPLING.top_p,
        seed: int | None = None,
        stop: str | Sequence[str] | None = (),
        ignore_eos: bool = False,
        **options: Unpack[GenerateOptions],
    ) -> GenerationResult:
        """Generate up to ``max_tokens`` tokens after ``prompt`` (text or ids; None: until
        the context is full).

        Temperature 0 is greedy: the output equals the target's own greedy
        output. At temperature > 0, ``verify="rejection"`` (default unseeded) samples
        the draft from the drafter's distribution q and accepts a token with
        probability min(1, p/q), resampling from max(0, p - q) on rejection;
        ``verify="match"`` accepts a greedy draft token only when the target's own
        sample equals it; ``verify="coupled"`` (default seeded) gives the target alone's
        text for the seed (Gumbel-max, noise keyed by seed, position, token). All three
        keep p exactly; the same chain (llama.cpp's order: logit bias, penalties,
        top-n-sigma, top-k, typical-p, top-p, min-p, temperature) shapes p and q.

        Keyword options (``GenerateOptions``, defaults as ``SamplingConfig``'s):
        ``min_p``, ``typical_p``, ``top_n_sigma``, ``repeat_penalty``,
        ``frequency_penalty``, ``presence_penalty``, ``penalty_last_n``,
        ``logit_bias``, ``verify``, ``draft_max``, ``draft_min``, ``draft_p_min``,
        ``cache_prompt``, ``logprobs``, ``top_logprobs``, ``post_sampling_probs``,
        ``grammar``, ``json_schema``.

        ``grammar`` (GBNF text or a ``Grammar``) or ``json_schema`` (a mapping or
        JSON text): the output follows it. The target's rows are masked before the
        sampler chain and the drafter's block follows it too, so greedy output is
        the constrained target's and sampling keeps its distribution exactly.

        ``logprobs=True`` fills ``result.logprobs``: one ``TokenLogprob`` per
        token, read from the verification pass that produced it (no extra pass),
        with the ``top_logprobs`` most likely tokens at that position. They are
        the model's (log-softmax of the raw logits) unless
        ``post_sampling_probs=True``, which reports the sampler chain's
        distribution instead (llama-server's ``post_sampling_probs``).

        finish_reason is "eos" (end of generation token, not included), "stop"
        (a stop string appeared; it and what follows are cut) or "length"
        (max_tokens reached, or the context is full).

        ``cache_prompt`` (default True, as in llama-server and llama-cpp-python):
        the longest prefix of the prompt that the contexts already hold (the
        previous prompt and its output) is not evaluated again; the output is
        the same either way. ``stats.cached_tokens`` says how many were kept."""
        cfg = _sampling("generate", max_tokens, temperature, top_k, top_p, seed, stop, ignore_eos, options)
        gen = Generation(self, self._request(prompt, cfg))
        gen.wait()
        return gen.result()

    def stream(
        self,
        prompt: Prompt,
        max_tokens: int | None = _SAMPLING.max_tokens,
        temperature: float = _SAMPLING.temperature,
        top_k: int = _SAMPLING.top_k,
        top_p: float = _SAMPLING.top_p,
        seed: int | None = None,
        stop: str | Sequence[str] | None = (),
        ignore_eos: bool = False,
        **options: Unpack[GenerateOptions],
    ) -> Iterator[StreamStep]:
        """Like ``generate`` (same options), one ``StreamStep`` per speculative
        step (where nothing is drafted for a while, one per run of plain steps, up
        to ~16 ms of them). The last step carries the finish_reason."""
        cfg = _sampling("stream", max_tokens, temperature, top_k, top_p, seed, stop, ignore_eos, options)
        return iter(Generation(self, self._request(prompt, cfg)))

    def submit(
        self,
        prompt: Prompt,
        max_tokens: int | None = _SAMPLING.max_tokens,
        temperature: float = _SAMPLING.temperature,
        top_k: int = _SAMPLING.top_k,
        top_p: float = _SAMPLING.top_p,
        seed: int | None = None,
        stop: str | Sequence[str] | None = (),
        ignore_eos: bool = False,
        slot: int | None = None,
        **options: Unpack[GenerateOptions],
    ) -> Submission:
        """Start a generation (options as ``generate``) and return at once: it
        runs beside the others in a free sequence slot (``slot``: that one, as
        llama-server's ``id_slot``; -1 or None: the engine's choice), or waits for
        one. Read its steps by iterating the ``Submission`` (also ``async for``),
        or wait for ``result()`` / ``await aresult()``. Thread-safe.

        >>> subs = [llm.submit(p, max_tokens=64) for p in prompts]
        >>> texts = [s.result().text for s in subs]"""
        cfg = _sampling("submit", max_tokens, temperature, top_k, top_p, seed, stop, ignore_eos, options)
        return Submission(Generation(self, self._request(prompt, cfg, slot)))

    def generate_batch(
        self,
        prompts: Sequence[Prompt],
        max_tokens: int | None = _SAMPLING.max_tokens,
        temperature: float = _SAMPLING.temperature,
        top_k: int = _SAMPLING.top_k,
        top_p: float = _SAMPLING.top_p,
        seed: int | None = None,
        stop: str | Sequence[str] | None = (),
        ignore_eos: bool = False,
        **options: Unpack[GenerateOptions],
    ) -> list[GenerationResult]:
        """``generate`` for each prompt, all submitted at once (``n_parallel`` run
        together, the rest as slots free up); results in the order of ``prompts``.
        Every prompt is checked before any runs; an error cancels the rest."""
        if isinstance(prompts, (str, bytes)):
            raise TypeError("prompts must be a sequence of prompts (for one prompt, use generate())")
        cfg = _sampling("generate_batch", max_tokens, temperature, top_k, top_p, seed, stop, ignore_eos, options)
        gens = [Generation(self, self._request(p, cfg)) for p in prompts]
        subs = [Submission(g) for g in gens]
        try:
            Generation.run_all(gens)  # each one's stop strings searched as its steps come
            return [s.result() for s in subs]
        finally:
            for s in subs:
                s.cancel()

    def _request(self, prompt: Prompt, cfg: SamplingConfig, slot: int | None = None) -> Request:
        """The checked request of ``prompt`` (text or ids) with ``cfg``, built in the caller's thread."""
        return make_request(self.prompt_tokens(prompt), cfg, self.pair, self.config, slot=slot)

    def __repr__(self) -> str:
        if self.closed:
            return "<pydflash.Llama closed>"
        d = f" draft='{self._draft.path}'" if self._draft is not None else ""
        np = f" n_parallel={self.n_parallel}" if self.n_parallel > 1 else ""
        return f"<pydflash.Llama '{self._model().path}'{d} n_ctx={self.n_ctx()}{np}>"

    # -- OpenAI-style API (pydflash.openai.completions) -------------------------

    @classmethod
    def from_pretrained(
        cls,
        repo_id: str,
        filename: str | None = None,
        *,
        draft_repo_id: str | None = None,
        draft_filename: str | None = None,
        revision: str | None = None,
        draft_revision: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        local_files_only: bool = False,
        token: str | None = None,
        **kwargs: Any,
    ) -> Llama:
        """Download (or find in the cache) a GGUF target, and optionally a DFlash
        drafter, from the Hugging Face Hub; filenames may be globs. Other keyword
        arguments go to ``Llama(...)``. See ``pydflash.hub.resolve_pair``."""
        from .hub import resolve_pair

        if "draft" in kwargs:
            raise TypeError("from_pretrained takes draft_repo_id / draft_filename, not draft=")
        target, draft = resolve_pair(
            repo_id,
            filename,
            draft_repo_id=draft_repo_id,
            draft_filename=draft_filename,
            revision=revision,
            draft_revision=draft_revision,
            cache_dir=cache_dir,
            local_files_only=local_files_only,
            token=token,
        )
        return cls(target, draft=draft, **kwargs)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> ChatPrompt:
        """The prompt the chat template makes of ``messages`` (nothing is generated)."""
        return self.chat_template.apply(
            messages,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            tools=tools,
            **template_kwargs,
        )

    @property
    def chat_template(self) -> ChatTemplate:
        """The chat template in use (the ``chat_template`` given, else the GGUF's
        own, else ChatML), parsed once on first use."""
        t = self._chat_template
        if t is None:
            t = ChatTemplate(self._model(), self._chat_template_source)
            self._chat_template = t
        return t

    # -- what a Generation and the completions need (GenerationHost, CompletionHost) ---

    def submit_request(
        self, request: Request, quiet: bool = False, cancel_check: Callable[[], bool] | None = None
    ) -> RequestHandle:
        """Queue ``request`` for the engine (a free slot, else its turn); its handle."""
        self._model()
        assert self._engine is not None
        if self._cache is not None and request.config.cache_prompt and not self._engine.closed:
            load_longest_prefix(self._cache, self._engine, list(request.prompt))
        return self._engine.submit(request, quiet, cancel_check)

    def run_generation(self, gen: Generation) -> None:
        """Queue ``gen`` for the engine (internal, as before: ``gen.submit()``)."""
        gen.submit()

    def cancel_generation(self, gen: Generation) -> None:
        """Stop ``gen``, queued or running (internal: ``gen.cancel()``)."""
        gen.cancel()

    def prompt_tokens(self, prompt: Prompt) -> list[int]:
        """The token ids a generation starts from: text is tokenized (an empty
        text becomes BOS), a list of ids is checked against the vocabulary."""
        model = self._model()
        if isinstance(prompt, (str, bytes)):
            tokens = self.tokenize(prompt, special=True)  # as llama-cpp-python's completions
            if not tokens:
                if model.bos < 0:
                    raise ValueError("prompt is empty and the vocabulary has no BOS token to start from")
                tokens = [model.bos]
            return tokens
        tokens = token_list(prompt, model.n_vocab)
        if not tokens:
            raise ValueError("prompt token list is empty")
        return tokens


def _sampling(
    caller: str,
    max_tokens: int | None,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    stop: str | Sequence[str] | None,
    ignore_eos: bool,
    options: GenerateOptions,
) -> SamplingConfig:
    """The checked config of generate/stream/submit/generate_batch's arguments."""
    for name in options:
        if name not in GenerateOptions.__annotations__:
            known = [*GenerateOptions.__annotations__, "max_tokens", "temperature", "top_k", "top_p", "seed", "stop"]
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}{hint}")
    return SamplingConfig.build(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop=stop,
        ignore_eos=ignore_eos,
        **options,
    )
