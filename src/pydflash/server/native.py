"""llama-server's native completion (``POST /completion``, ``/infill``) on the
generation loop: its request fields (``n_predict``, ``n_probs``, ``return_tokens``,
prompts as text, token ids or mixed lists), its response (``content``, ``tokens``,
``stop_type``, ``timings``, ``generation_settings``, ``completion_probabilities``)
and its stream (one object per token, speculative step or not, each with that token's
probabilities and timings; no ``[DONE]``), with the same defaults."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, create_model

from ..config import SamplingConfig
from ..engine.generation import Generation
from ..engine.request import make_request
from ..llama import Llama
from ..openai.structured import constraint
from ..options import LLAMA_CPP_DEFAULTS, OPTIONS
from ..results import TokenLogprob
from .base import BadRequest, LlamaFields, Unsupported, option_fields, plain_options
from .requests import MAX_PROMPTS, check_probs

__all__ = ["InfillRequest", "NativeRequest", "fim_tokens", "pieces", "tokenize_mixed"]

_STOP_TYPE = {"eos": "eos", "stop": "word", "length": "limit", None: "none"}
Mixed = list[Annotated[str | int, Field(union_mode="left_to_right")]]
_CORE = SamplingConfig()  # the core's defaults, where llama-server's are the same


class JsonPrompt(BaseModel):
    """llama-server's prompt object: ``{"prompt_string": text or mixed ids,
    "multimodal_data": [base64, ...]}`` (media refused: pydflash reads text)."""

    model_config = ConfigDict(extra="ignore")

    prompt_string: str | Mixed
    multimodal_data: list[Any] | None = None

    def text(self) -> str | Mixed:
        if self.multimodal_data is not None:
            raise BadRequest("Multimodal data provided, but model does not support multimodal requests.", "prompt")
        return self.prompt_string


def tokenize_mixed(llm: Llama, prompt: str | Sequence[str | int], add_special: bool, parse_special: bool) -> list[int]:
    """llama-server's ``tokenize_mixed``: text, ids, or a list of both (the first
    text part alone gets BOS)."""
    model = llm.core_model
    if isinstance(prompt, str):
        return list(model.tokenize(prompt, add_special, parse_special))
    out: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, str):
            out += model.tokenize(part, add_special and i == 0, parse_special)
        else:
            if not 0 <= part < llm.n_vocab():
                raise BadRequest(f"token id {part} is out of range [0, {llm.n_vocab()})", "prompt")
            out.append(part)
    return out


def pieces(llm: Llama, tokens: Sequence[int]) -> list[str | list[int]]:
    """Each token's text; its bytes where they are not valid UTF-8 (as llama-server)."""

    def text(raw: bytes) -> str | list[int]:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return list(raw)

    return [text(raw) for raw in llm.core_model.token_pieces(tokens, True)]


def _probs(llm: Llama, lps: Sequence[TokenLogprob], post: bool) -> list[dict[str, Any]]:
    """llama-server's ``completion_probabilities`` (``prob``/``top_probs`` with post_sampling_probs)."""

    def one(token: int, logprob: float) -> dict[str, Any]:
        raw = bytes(llm.core_model.token_to_piece(token, True))
        entry: dict[str, Any] = {"id": token, "token": raw.decode("utf-8", "replace"), "bytes": list(raw)}
        if post:
            entry["prob"] = math.exp(logprob)
        else:
            entry["logprob"] = logprob
        return entry

    out = []
    for lp in lps:
        entry = one(lp.token, lp.logprob)
        entry["top_probs" if post else "top_logprobs"] = [one(t, v) for t, v in lp.top]
        out.append(entry)
    return out


# the options /completion reads itself; the others are fields made from the declaration, with
# llama-server's defaults where they are not the core's (llama.cpp's common_params_sampling)
_OWN = ("n_probs", "repeat_last_n", "seed", "ignore_eos", "post_sampling_probs", "logit_bias", "grammar",
        "json_schema", *LlamaFields.model_fields)  # fmt: skip
_DEFAULTS = {o.name: o.default for o in OPTIONS if o.default is not None} | dataclasses.asdict(LLAMA_CPP_DEFAULTS)
_PLAIN = plain_options("native", _OWN)

if TYPE_CHECKING:
    _Options = LlamaFields
else:
    _Options = create_model(
        "_Options", __base__=LlamaFields, __module__=__name__, **option_fields("native", _OWN, _DEFAULTS)
    )


class NativeRequest(_Options):
    """``POST /completion``: llama-server's fields and defaults (the plain options' fields are
    made from the declaration: ``_Options``)."""

    model_config = ConfigDict(extra="ignore")

    prompt: str | Mixed | JsonPrompt | list[str | Mixed | JsonPrompt] = ""
    stream: bool = False
    repeat_last_n: int = _CORE.penalty_last_n
    seed: int | None = None
    ignore_eos: bool = False
    n_probs: int = 0
    post_sampling_probs: bool = False
    return_tokens: bool = False
    return_progress: bool = False  # prompt_progress events in a stream
    timings_per_token: bool = False  # each chunk of a stream with the timings as they stand
    id_slot: int = -1  # -1: any slot
    logit_bias: list[list[Any]] | dict[str, Any] | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    lora: list[Any] | None = None
    multimodal_data: list[Any] | None = None

    done_marker: ClassVar[bool] = False  # llama-server ends a native stream without "[DONE]"

    def prompt_bytes(self) -> int:
        """UTF-8 bytes of the longest prompt's text (each prompt is bounded alone)."""
        sizes = [0]
        for p in self._prompts():
            parts = [p] if isinstance(p, str) else [x for x in p if isinstance(x, str)]
            sizes.append(sum(len(t.encode("utf-8", "surrogatepass")) for t in parts))
        return max(sizes)

    def check(self, n_vocab: int, parallel: int) -> None:
        if self.lora:
            raise Unsupported("LoRA adapters are not supported", "lora")
        if self.multimodal_data:
            raise Unsupported("multimodal input is not supported", "multimodal_data")
        self.check_common(parallel)
        if self.repeat_last_n < -1:
            raise BadRequest(
                f"'repeat_last_n' must be -1 (the context) or >= 0, got {self.repeat_last_n}", "repeat_last_n"
            )
        if self.stream and len(self._prompts()) != 1:
            raise BadRequest("a stream takes one prompt", "prompt")
        if len(self._prompts()) > MAX_PROMPTS:
            raise BadRequest(f"'prompt' may hold at most {MAX_PROMPTS} prompts, got {len(self._prompts())}", "prompt")
        check_probs("n_probs", self.n_probs)

    def _prompts(self) -> list[str | Mixed]:
        """The prompts, as llama-server reads ``prompt``: a text, a prompt object, a list of
        ids and texts (one prompt), or a list of texts, objects or such lists (one prompt each)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p, JsonPrompt):
            return [p.text()]
        if any(isinstance(x, int) for x in p) and not any(isinstance(x, (list, JsonPrompt)) for x in p):
            return [p]  # type: ignore[list-item]  # ids, or ids and texts: one prompt
        return [x.text() if isinstance(x, JsonPrompt) else x for x in p]  # type: ignore[misc]

    def _bias(self, llm: Llama) -> dict[int, float] | None:
        """llama-server's logit_bias: ``[[token or text, bias or false], ...]`` or ``{"token": bias}``."""
        out: dict[int, float] = {}
        pairs = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias or []
        for pair in pairs:
            if len(pair) != 2:
                raise BadRequest("logit_bias entries must be [token, bias]", "logit_bias")
            key, bias = pair
            value = -math.inf if bias is False else float(bias)
            if isinstance(key, str) and not key.lstrip("-").isdigit():
                ids = llm.core_model.tokenize(key, False, False)
            else:
                ids = [int(key)]
            for t in ids:
                if not 0 <= t < llm.n_vocab():
                    raise BadRequest(f"logit_bias token {t} is out of range [0, {llm.n_vocab()})", "logit_bias")
                out[t] = value
        if self.ignore_eos:  # llama-server's: the end-of-generation tokens are never sampled
            out.update(dict.fromkeys(llm.core_model.eog_tokens(), -math.inf))
        return out or None

    def tokens(self, llm: Llama, prompt: str | Mixed) -> list[int]:
        tokens = tokenize_mixed(llm, prompt, True, True)
        if not tokens:
            bos = llm.core_model.bos
            if bos < 0:
                raise BadRequest("the prompt is empty", "prompt")
            tokens = [bos]
        return tokens

    def reported_n_predict(self) -> int:
        """The request's n_predict as llama-server reports it (absent: -n's)."""
        given = self.budget_given()
        return self.n_default if given is None else given[1]

    def config(self, llm: Llama) -> SamplingConfig:
        schema, gbnf = constraint(self.response_format, self.json_schema, self.grammar)
        stops = self.stops()
        return SamplingConfig.build(
            **{name: v for name, wire in _PLAIN.items() if (v := self.given(wire)) is not None},
            max_tokens=self.token_budget(),
            penalty_last_n=llm.n_ctx_slot if self.repeat_last_n == -1 else self.repeat_last_n,  # -1: the context
            seed=None if self.seed is None or self.seed < 0 else self.seed,
            stop=[s for s in stops if s],
            logit_bias=self._bias(llm),
            ignore_eos=self.ignore_eos,
            logprobs=self.n_probs > 0,
            top_logprobs=self.n_probs,
            post_sampling_probs=self.post_sampling_probs,
            grammar=gbnf,
            json_schema=schema,
        )

    def settings(self, llm: Llama, cfg: SamplingConfig) -> dict[str, Any]:
        """llama-server's ``generation_settings`` (the fields pydflash has)."""
        n = self.reported_n_predict()
        return {
            "n_predict": n,
            "seed": -1 if self.seed is None else self.seed,
            "temperature": cfg.temperature,
            "dynatemp_range": 0.0,
            "dynatemp_exponent": 1.0,
            "xtc_probability": 0.0,
            "xtc_threshold": 0.1,
            "dry_multiplier": 0.0,
            "dry_base": 1.75,
            "dry_allowed_length": 2,
            "dry_penalty_last_n": -1,
            "mirostat_tau": 5.0,
            "mirostat_eta": 0.1,
            "adaptive_target": -1.0,
            "adaptive_decay": 0.9,
            "n_keep": 0,
            "n_discard": 0,
            "timings_per_token": self.timings_per_token,
            "lora": [],
            "top_k": cfg.top_k,
            "top_p": cfg.top_p,
            "min_p": cfg.min_p,
            "typical_p": cfg.typical_p,
            "top_n_sigma": cfg.top_n_sigma,
            "repeat_last_n": cfg.penalty_last_n,
            "repeat_penalty": cfg.repeat_penalty,
            "presence_penalty": cfg.presence_penalty,
            "frequency_penalty": cfg.frequency_penalty,
            "mirostat": 0,
            "stop": list(cfg.stop),
            # -inf shows as null, as in llama-server's JSON
            "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in cfg.logit_bias],
            "max_tokens": n,
            "n_probs": self.n_probs,
            "min_keep": 0,
            "ignore_eos": cfg.ignore_eos,
            "stream": self.stream,
            "post_sampling_probs": self.post_sampling_probs,
            "samplers": ["penalties", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "temperature"],
            "speculative.n_max": cfg.draft_max if cfg.draft_max is not None else -1,
            "speculative.n_min": cfg.draft_min,
            "speculative.p_min": cfg.draft_p_min,
        }

    def respond(self, llm: Llama, model: str, cancel: Callable[[], bool]) -> Any:
        """The response (a dict; a list of them for several prompts) or a stream's chunks."""
        prompts = self._prompts()
        if len(prompts) == 1:
            return self.run(llm, model, cancel, self.tokens(llm, prompts[0]))
        return [dict(self.run(llm, model, cancel, self.tokens(llm, p)), index=i) for i, p in enumerate(prompts)]

    def run(self, llm: Llama, model: str, cancel: Callable[[], bool], tokens: list[int]) -> Any:
        cfg = self.config(llm)
        slot = None if self.id_slot < 0 else self.id_slot
        request = make_request(
            llm.prompt_tokens(tokens),  # the ids a mixed prompt gave, checked against the vocabulary
            cfg,
            llm.pair,
            llm.config,
            slot=slot,
            progress=self.stream and self.return_progress,
            timings_per_token=self.stream and self.timings_per_token,
            per_token=self.stream,
        )
        gen = Generation(llm, request)
        settings = self.settings(llm, cfg)
        if self.stream:
            return self._chunks(llm, gen, cancel, model, settings)
        steps = gen.wait(cancel)
        text = "".join(s.text for s in steps)
        out = self._final(llm, gen, model, settings, text)
        if gen.logprobs is not None and self.n_probs > 0:
            out["completion_probabilities"] = _probs(llm, gen.logprobs, self.post_sampling_probs)
        return out

    def _final(self, llm: Llama, gen: Generation, model: str, settings: dict[str, Any], text: str) -> dict[str, Any]:
        n_prompt, n_gen = len(gen.prompt), len(gen.tokens)
        n = gen.config.max_tokens
        return {
            "index": 0,
            "content": text,
            "tokens": list(gen.tokens) if self.return_tokens and not self.stream else [],
            "id_slot": gen.slot if gen.slot is not None else self.id_slot,
            "stop": True,
            "model": model,
            "tokens_predicted": n_gen,
            "tokens_evaluated": n_prompt,
            "generation_settings": settings,
            "prompt": llm.detokenize(gen.prompt, special=True).decode("utf-8", "replace"),
            "has_new_line": "\n" in text,
            # llama-server's: stopped because the context is full
            "truncated": gen.finish == "length" and (n is None or len(gen.tokens) < n),
            "stop_type": _STOP_TYPE[gen.finish],
            "stopping_word": "",
            "tokens_cached": n_prompt + n_gen,
            "timings": gen.timings(),
            "speculative": gen.speculative(),
        }

    def _chunks(
        self, llm: Llama, gen: Generation, cancel: Callable[[], bool], model: str, settings: dict[str, Any]
    ) -> Iterator[dict[str, Any]]:
        it = gen.run(cancel)
        n = 0
        try:
            for step in it:
                n += len(step.tokens)
                if not (step.text or step.tokens or step.prompt_progress):
                    continue
                chunk: dict[str, Any] = {
                    "index": 0,
                    "content": step.text,
                    "tokens": list(step.tokens),
                    "stop": False,
                    "id_slot": gen.slot if gen.slot is not None else self.id_slot,
                    "tokens_predicted": n,
                    "tokens_evaluated": len(gen.prompt),
                }
                if step.prompt_progress is not None:
                    chunk["prompt_progress"] = dataclasses.asdict(step.prompt_progress)
                if step.timings is not None:
                    chunk["timings"] = step.timings
                if step.logprobs and self.n_probs > 0:
                    chunk["completion_probabilities"] = _probs(llm, step.logprobs, self.post_sampling_probs)
                yield chunk
            yield self._final(llm, gen, model, settings, "")
        finally:
            it.close()


# between extra chunks when the vocabulary has no FIM_SEP (llama-server's k_chunk_prefix_str)
SNIPPET = "\n\n--- snippet ---\n\n"


def fim_tokens(llm: Llama) -> dict[str, int]:
    """The model's FIM tokens the infill prompt uses (``pre``, ``suf``, ``mid``, ``rep``,
    ``sep``: those it has), as llama.cpp's vocabulary finds them (the GGUF's ids, else a
    token of one of the known texts)."""
    return {part: t for part, t in llm.core_model.fim_tokens().items() if part != "pad"}


class InfillRequest(NativeRequest):
    """``POST /infill``: fill in the middle between ``input_prefix`` and ``input_suffix``
    (``input_extra``: other files, before them), with the model's FIM tokens, in
    llama-server's prompt (``format_prompt_infill``)."""

    prompt: str = ""  # text only, as llama-server's /infill takes it
    input_prefix: str | Mixed
    input_suffix: str | Mixed
    input_extra: list[dict[str, Any]] = Field(default_factory=list)

    def check(self, n_vocab: int, parallel: int) -> None:
        super().check(n_vocab, parallel)
        for chunk in self.input_extra:
            if not isinstance(chunk.get("text"), str):
                raise BadRequest('extra_context chunk must contain a "text" field with a string value', "input_extra")
            if not isinstance(chunk.get("filename", ""), str):
                raise BadRequest('extra_context chunk\'s "filename" field must be a string', "input_extra")

    def infill_tokens(self, llm: Llama) -> list[int]:
        """llama-server's FIM prompt (spm_infill off): [extra chunks] [BOS] FIM_PRE prefix
        prompt FIM_SUF suffix FIM_MID, each part cut to what its share of a batch (and the
        context, for the extra) holds."""
        fim = fim_tokens(llm)
        missing = [name for name in ("pre", "suf", "mid") if name not in fim]
        if missing:
            names = {"pre": "prefix", "suf": "suffix", "mid": "middle"}
            raise Unsupported(
                "Infill is not supported by this model: " + " ".join(f"{names[m]} token is missing." for m in missing)
            )
        model = llm.core_model

        def tok(text: str) -> list[int]:
            return list(model.tokenize(text, False, False))

        extra: list[int] = []
        if "rep" in fim:
            extra += [fim["rep"], *tok("myproject\n")]
        for chunk in self.input_extra:
            if "sep" in fim:
                extra += [fim["sep"], *tok(chunk.get("filename", "tmp") + "\n")]
            else:
                extra += tok(SNIPPET)
            extra += tok(chunk["text"])
        if "sep" in fim:
            extra += [fim["sep"], *tok("filename\n")]
        prefix = tokenize_mixed(llm, self.input_prefix, False, False)
        suffix = tokenize_mixed(llm, self.input_suffix, False, False)
        prompt = list(model.tokenize(self.prompt, False, True))
        n_batch, n_ctx = llm.config.n_batch, llm.n_ctx_slot
        # the FIM part fits a batch (prefix:suffix 3:1); the extra fills the context's rest
        n_prefix = min(len(prefix), 3 * (n_batch // 4))
        n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
        n_extra = min(max(0, n_ctx - n_batch - 2 * self.n_default), len(extra))
        head = [fim["pre"], *prefix[len(prefix) - n_prefix :], *prompt]
        if model.add_bos and model.bos >= 0:
            head.insert(0, model.bos)
        return extra[len(extra) - n_extra :] + head + [fim["suf"], *suffix[:n_suffix], fim["mid"]]

    def respond(self, llm: Llama, model: str, cancel: Callable[[], bool]) -> Any:
        return self.run(llm, model, cancel, self.infill_tokens(llm))
