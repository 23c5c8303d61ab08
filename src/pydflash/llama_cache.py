"""llama-cpp-python's state cache: ``LlamaState`` (what ``save_state`` keeps) and the
caches ``Llama.set_cache`` takes, ``LlamaRAMCache`` and ``LlamaDiskCache``, keyed by the
tokens a state holds and looked up by the longest prefix of a prompt, as in
llama-cpp-python."""

from __future__ import annotations

import abc
import collections
import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .engine.engine import Engine
from .errors import PyDFlashError

__all__ = [
    "BaseLlamaCache",
    "LlamaDiskCache",
    "LlamaRAMCache",
    "LlamaState",
    "common_prefix",
    "load_longest_prefix",
    "sequence_state",
]

_CAPACITY = 2 << 30  # llama-cpp-python's default: 2 GiB


@dataclasses.dataclass(frozen=True)
class LlamaState:
    """What ``save_state`` keeps: the evaluated tokens and both contexts' memory of
    them (the target's KV cache, the drafter's features), as llama-cpp-python's
    ``LlamaState`` (``llama_state`` is pydflash's slot file, not llama.cpp's)."""

    input_ids: npt.NDArray[np.intc]
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int


def _key(tokens: Sequence[int]) -> tuple[int, ...]:
    if isinstance(tokens, (str, bytes)):
        raise TypeError("a cache key is a sequence of token ids")
    return tuple(int(t) for t in tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the prefix token sequences ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class BaseLlamaCache(abc.ABC):
    """States keyed by their tokens; ``cache[prompt]`` is the state whose tokens share the
    longest prefix with ``prompt`` (KeyError: none shares one); the least recently used
    ones go once ``cache_size`` passes ``capacity_bytes``."""

    def __init__(self, capacity_bytes: int = _CAPACITY):
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be an int >= 0, got {capacity_bytes!r}")
        self.capacity_bytes = capacity_bytes

    @property
    @abc.abstractmethod
    def cache_size(self) -> int:
        """The bytes of the states held."""

    @abc.abstractmethod
    def keys(self) -> list[tuple[int, ...]]:
        """The token sequences of the states held, least recently used first."""

    @abc.abstractmethod
    def _load(self, key: tuple[int, ...]) -> LlamaState: ...

    @abc.abstractmethod
    def _store(self, key: tuple[int, ...], value: LlamaState) -> None: ...

    @abc.abstractmethod
    def _drop(self, key: tuple[int, ...]) -> None: ...

    def longest_prefix(self, tokens: Sequence[int]) -> tuple[int, ...] | None:
        """The key sharing the longest prefix with ``tokens`` (None: no key shares one)."""
        key = _key(tokens)
        best, n_best = None, 0
        for k in self.keys():
            n = common_prefix(k, key)
            if n > n_best:
                best, n_best = k, n
        return best

    def __getitem__(self, tokens: Sequence[int]) -> LlamaState:
        key = self.longest_prefix(tokens)
        if key is None:
            raise KeyError("no cached state shares a prefix with these tokens")
        return self._load(key)

    def __contains__(self, tokens: object) -> bool:
        return isinstance(tokens, Sequence) and self.longest_prefix(tokens) is not None

    def __setitem__(self, tokens: Sequence[int], value: LlamaState) -> None:
        if not isinstance(value, LlamaState):
            raise TypeError(f"a cache holds LlamaState values, not {type(value).__name__}")
        key = _key(tokens)
        if key in self.keys():
            self._drop(key)
        self._store(key, value)
        while self.cache_size > self.capacity_bytes and self.keys():
            self._drop(self.keys()[0])


class LlamaRAMCache(BaseLlamaCache):
    """States kept in this process's memory."""

    def __init__(self, capacity_bytes: int = _CAPACITY):
        super().__init__(capacity_bytes)
        self._states: collections.OrderedDict[tuple[int, ...], LlamaState] = collections.OrderedDict()

    @property
    def cache_size(self) -> int:
        """The bytes of the states held."""
        return sum(s.llama_state_size for s in self._states.values())

    def keys(self) -> list[tuple[int, ...]]:
        """The token sequences of the states held, least recently used first."""
        return list(self._states)

    def _load(self, key: tuple[int, ...]) -> LlamaState:
        self._states.move_to_end(key)
        return self._states[key]

    def _store(self, key: tuple[int, ...], value: LlamaState) -> None:
        self._states[key] = value

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._states[key]


class LlamaDiskCache(BaseLlamaCache):
    """States kept as files in ``cache_dir`` (numpy ``.npz``, no pickles), found again by a
    later process on the same model files and settings."""

    def __init__(self, cache_dir: str | os.PathLike[str] = ".cache/llama_cache", capacity_bytes: int = _CAPACITY):
        super().__init__(capacity_bytes)
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)

    def _path(self, key: tuple[int, ...]) -> Path:
        return self.cache_dir / (hashlib.sha256(np.asarray(key, dtype=np.int64).tobytes()).hexdigest() + ".npz")

    def _files(self) -> list[Path]:
        return sorted(self.cache_dir.glob("*.npz"), key=lambda p: p.stat().st_mtime_ns)

    @property
    def cache_size(self) -> int:
        """The bytes of the state files."""
        return sum(p.stat().st_size for p in self._files())

    def keys(self) -> list[tuple[int, ...]]:
        """The token sequences of the states held, least recently used first."""
        out = []
        for p in self._files():
            with np.load(p, allow_pickle=False) as f:
                out.append(tuple(int(t) for t in f["key"]))
        return out

    def _load(self, key: tuple[int, ...]) -> LlamaState:
        path = self._path(key)
        os.utime(path)  # recently used
        with np.load(path, allow_pickle=False) as f:
            data = f["llama_state"].tobytes()
            return LlamaState(f["input_ids"].astype(np.intc), int(f["n_tokens"]), data, len(data), int(f["seed"]))

    def _store(self, key: tuple[int, ...], value: LlamaState) -> None:
        tmp = self._path(key).with_suffix(".part")
        with open(tmp, "wb") as f:
            np.savez(
                f,
                key=np.asarray(key, dtype=np.int64),
                input_ids=np.asarray(value.input_ids, dtype=np.int64),
                n_tokens=value.n_tokens,
                llama_state=np.frombuffer(value.llama_state, dtype=np.uint8),
                seed=value.seed,
            )
        tmp.replace(self._path(key))  # whole or not at all, for a reader in another process

    def _drop(self, key: tuple[int, ...]) -> None:
        self._path(key).unlink(missing_ok=True)


# -- sequence 0 of a pair and a cache (Llama.set_cache) ---------------------------------
# A cache is a shortcut, never a wait: where a generation holds the sequence, nothing happens.


def sequence_state(engine: Engine, seed: int) -> LlamaState | None:
    """Sequence 0's state, keyed by the tokens it holds (None: it holds none, or is in use)."""
    if engine.busy_slots():
        return None
    try:
        with engine.hold(0) as slot, tempfile.TemporaryDirectory() as tmp:
            tokens = slot.tokens()  # under the same hold as the save: the key matches the state
            if not tokens:
                return None
            path = os.path.join(tmp, "state")
            slot.save(path)
            data = Path(path).read_bytes()
    except PyDFlashError:  # a generation took it meanwhile
        return None
    return LlamaState(np.array(tokens, dtype=np.intc), len(tokens), data, len(data), seed)


def load_longest_prefix(cache: BaseLlamaCache, engine: Engine, prompt: Sequence[int]) -> bool:
    """Sequence 0 from the cached state that shares the longest prefix with ``prompt``, where
    that is longer than what the sequence holds; whether it was loaded."""
    key = cache.longest_prefix(prompt)
    if key is None or engine.busy_slots() or common_prefix(key, prompt) <= common_prefix(engine.slot_tokens(0), prompt):
        return False
    state = cache[key]
    try:
        with engine.hold(0) as slot, tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "state")
            Path(path).write_bytes(state.llama_state)
            slot.load(path)
    except PyDFlashError:  # a generation took it meanwhile
        return False
    return True
