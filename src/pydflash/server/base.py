"""The shape of every generation request the server takes (exchange.py runs them):
``ServerRequest``, with the one check of what all kinds share (``check_common``:
stop strings, refused samplers, the slot pin, the token budget), and the errors a
request's checks raise. Each kind (requests.py, native.py, anthropic.py,
responses.py) translates its own fields into these and nothing else."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from ..options import OPTIONS, option, refused

if TYPE_CHECKING:
    from ..llama import Llama

__all__ = [
    "INT32_MAX",
    "MAX_STOP",
    "MAX_STOP_CHARS",
    "REFUSED_SAMPLERS",
    "BadRequest",
    "LlamaFields",
    "NoVision",
    "ServerRequest",
    "Stop",
    "Unsupported",
    "budget",
    "option_fields",
    "plain_options",
]


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400); ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class Unsupported(BadRequest):
    """A feature pydflash does not have (HTTP 501, llama-server's ``not_supported_error``)."""


class NoVision(BadRequest):
    """An image for a model without vision: llama-server's HTTP 500 ``server_error``,
    with its message (it converts the image, then finds no projector to read it)."""

    def __init__(self, param: str | None = None):
        super().__init__(
            "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj", param
        )


# llama-server's n_predict (aliases max_completion_tokens, max_tokens) as the library's
# max_tokens, on every endpoint (vendor/llama.cpp/tools/server: server-schema.cpp reads it
# with hard limits [-1, INT32_MAX]; server-context.cpp takes the request's value unless it
# is -1, else -n; -1 is no limit but the context; the budget is checked only after a
# sampled token, so 0 gives one)
INT32_MAX = 2**31 - 1


def budget(given: tuple[str, int] | None, server_n_predict: int = -1) -> int | None:
    """The library's ``max_tokens`` (None: until the context is full) for a request's
    ``n_predict`` (``given``: its field and value, None when absent) under ``-n``."""
    if given is not None:
        field, n = given
        if isinstance(n, bool) or not -1 <= n <= INT32_MAX:
            raise BadRequest(f"Field '{field}': Value must be between -1 <= value <= {INT32_MAX}, but got {n}", field)
    n = server_n_predict if given is None or given[1] == -1 else given[1]
    if n < 0:
        return None
    return max(n, 1)  # 0: llama-server samples one token before it checks the budget


def option_fields(api: str, skip: Collection[str], defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The request fields of the options the declaration (options.py) gives ``api``, by their
    names there (a dotted one, llama-server's ``speculative.n_max``, as an alias), of their JSON
    type, but those named in ``skip`` (the kind's own): for ``pydantic.create_model``.
    ``defaults``: the kind's own defaults, by option (else None: the library's)."""
    out: dict[str, Any] = {}
    for o in OPTIONS:
        wire = o.names[api]
        if wire is None or wire in skip:
            continue
        default: Any = (defaults or {}).get(o.name)
        kind: Any = o.json if default is not None else o.json | None
        name = wire.replace(".", "_")
        out[name] = (kind, Field(default=default, alias=wire) if name != wire else default)
    return out


def plain_options(api: str, skip: Collection[str]) -> dict[str, str]:
    """{option: its name in ``api``} for the options ``option_fields`` makes fields of."""
    return {o.name: wire for o in OPTIONS if (wire := o.names[api]) is not None and wire not in skip}


def must_be(expected: str) -> WrapValidator:
    """One error saying what a field of several accepted shapes must be (instead
    of one error per member of its union)."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("wrong_shape", "must be {expected}", {"expected": expected}) from None

    return WrapValidator(check)


Stop = Annotated[str | list[str] | None, must_be("a string or a list of strings")]

# stop strings are searched after every step, on the thread that runs every
# generation: a long list would slow all of them down
MAX_STOP = 16
MAX_STOP_CHARS = 256

# llama-server samplers that do not give one distribution per position, which exact
# speculative sampling needs (mirostat's and adaptive-p's state follow each sample, XTC
# draws at random what to remove, DRY is not implemented): refused by name when on
# (field, the value from which it is on): llama-server's "off" values are 0 (-1 for adaptive-p)
REFUSED_SAMPLERS: tuple[tuple[str, float], ...] = (
    ("mirostat", 1),
    ("xtc_probability", 1e-30),
    ("dry_multiplier", 1e-30),
    ("dynatemp_range", 1e-30),
    ("adaptive_target", 0),
)


class ServerRequest(BaseModel):
    """A generation request: how its reply is sent (the class attributes), the server's
    defaults for what it leaves out (``fill``), its checks before any work (``check``,
    which ``check_common`` begins) and its reply (``respond``). A kind says which of its
    fields hold the stop strings, the samplers, the slot pin and the token budget."""

    model_config = ConfigDict(extra="ignore")

    stream: bool | None = None

    done_marker: ClassVar[bool] = False  # a stream ends with "data: [DONE]" (OpenAI's)
    sse_event_names: ClassVar[bool] = False  # each event has an "event: TYPE" line (Anthropic's, Responses')
    keep_timings: ClassVar[bool] = True  # the reply shows llama-server's timings
    stop_field: ClassVar[str] = "stop"  # the field of the stop strings, as an error names it
    # the fields the server's defaults fill where the request leaves them out or null
    # (None: every field of the kind that the request leaves out)
    filled: ClassVar[tuple[str, ...] | None] = None
    # its column of the option declaration (options.py): the options it refuses by name;
    # a kind that becomes a chat request passes the others on (chat_options)
    api: ClassVar[str] = ""
    _n_default: int = PrivateAttr(-1)  # the server's -n (-1: none): what an absent or -1 budget means
    _jinja: bool = PrivateAttr(True)  # False: the server's --no-jinja (chat: no reply format)

    @property
    def n_default(self) -> int:
        """The server's ``-n`` (-1: none): what an absent or -1 token budget means."""
        return self._n_default

    @property
    def jinja(self) -> bool:
        """False under the server's ``--no-jinja``."""
        return self._jinja

    def chat_defaults(self) -> dict[str, Any]:
        """What a kind that becomes a chat request passes on to that request's ``fill``."""
        return {"max_tokens": self._n_default, "jinja": self._jinja}

    @property
    def lead(self) -> int:
        """The chunks a stream's response waits for before it starts: the first step's."""
        return 1

    def fill(self, defaults: Mapping[str, Any]) -> None:
        """The server's defaults (``-n``, ``--temp``, ...) for the fields the request leaves out;
        a default for a field this kind does not have leaves it alone."""
        for key, value in defaults.items():
            if key == "max_tokens":
                self._n_default = value
            elif key == "jinja":
                self._jinja = bool(value)
            elif self.filled is None:
                if key in type(self).model_fields and key not in self.model_fields_set:
                    setattr(self, key, value)
            elif key in self.filled and getattr(self, key) is None:
                setattr(self, key, value)

    # -- what a kind translates: its fields under the names check_common reads --------

    def given(self, name: str) -> Any:
        """The body's ``name`` (a field or, where the kind keeps them, an extra one); None: absent."""
        field = name.replace(".", "_")  # llama-server's dotted names are aliases
        if field in type(self).model_fields:
            return getattr(self, field)
        return (self.model_extra or {}).get(name)

    def chat_options(self) -> dict[str, Any]:
        """The options the body gives under this kind's names (the declaration's ``api``
        column) as the chat request's fields, but the token budget (``budget_given``)."""
        out: dict[str, Any] = {}
        for o in OPTIONS:
            mine, chat = o.names[self.api], o.names["chat"]
            if mine is None or chat is None or o.name == "max_tokens":
                continue
            if (value := self.given(mine)) is not None:
                out[chat] = value
        return out

    def stops(self) -> list[str]:
        """The stop strings (its ``stop_field``)."""
        return []

    def samplers(self) -> dict[str, float | None]:
        """The values of the REFUSED_SAMPLERS fields the kind has."""
        return {}

    def slot_pin(self) -> int | None:
        """The slot the request pins (-1 or None: any)."""
        return None

    def budget_given(self) -> tuple[str, int] | None:
        """(field, value) of the token budget the request gives (None: absent)."""
        return None

    # -- checks and reply ----------------------------------------------------------------

    def token_budget(self) -> int | None:
        """The library's ``max_tokens`` (None: until the context is full); BadRequest for a bad one."""
        return budget(self.budget_given(), self._n_default)

    def check_common(self, parallel: int) -> None:
        """What every kind is checked for before any work (BadRequest): its stop strings'
        bounds, the samplers pydflash refuses, its slot pin and its token budget."""
        for name in refused(self.api) if self.api else ():
            if self.given(name) not in (None, False, 0):  # off asks for nothing
                raise BadRequest(f"'{name}' is not supported on this endpoint ({self.api})", name)
        stops = self.stops()
        if len(stops) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise BadRequest(
                f"'{self.stop_field}' may hold at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters",
                self.stop_field,
            )
        given = self.samplers()
        for name, on in REFUSED_SAMPLERS:
            v = given.get(name)
            if v is not None and v >= on:
                raise BadRequest(
                    f"the '{name}' sampler is not supported (pydflash samples exactly under speculation; "
                    "its samplers: top_k, typical_p, top_p, min_p, top_n_sigma, temperature, penalties)",
                    name,
                )
        # the engine picks the slot (and with it the prompt cache) unless the request pins one
        slot = self.slot_pin()
        if slot is not None and slot != -1 and not 0 <= slot < parallel:
            raise BadRequest(f"'id_slot' must be -1 (any) or a slot in [0, {parallel})", "id_slot")
        self.token_budget()

    def check(self, n_vocab: int, parallel: int) -> None:
        """What the library does not check, before any work: BadRequest."""
        self.check_common(parallel)

    def prompt_bytes(self) -> int:
        """UTF-8 bytes of the prompt's text (0: none to bound)."""
        return 0

    def respond(self, llm: Llama, model: str, cancel: Callable[[], bool]) -> Any:
        """The reply (a JSON-able object) or a stream's chunks (an iterator of them)."""
        raise NotImplementedError


class LlamaFields(ServerRequest):
    """The fields llama-server reads on its OpenAI and native completions alike: the
    token budget under its three names, the stop strings, the slot pin, and the
    samplers pydflash refuses."""

    n_predict: int | None = None  # llama-server's name, first of the three (budget_given)
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    stop: Stop = None
    id_slot: int | None = None  # llama-server's slot pin (-1: any)
    mirostat: float | None = None
    xtc_probability: float | None = None
    dry_multiplier: float | None = None
    dynatemp_range: float | None = None
    adaptive_target: float | None = None

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def samplers(self) -> dict[str, float | None]:
        # by REFUSED_SAMPLERS' names: one added there without a field here fails loudly
        return {name: getattr(self, name) for name, _ in REFUSED_SAMPLERS}

    def slot_pin(self) -> int | None:
        return self.id_slot

    def budget_given(self) -> tuple[str, int] | None:
        # llama-server reads n_predict, then its aliases: the first one given counts
        for name in option("max_tokens").aliases["native"]:
            if (v := getattr(self, name)) is not None:
                return name, v
        return None
