"""Public functions and methods of pydflash are annotated (parameters and return)."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = ["pydflash", "pydflash.llama", "pydflash.chat", "pydflash.completions", "pydflash.hub",
           "pydflash.server", "pydflash.metrics", "pydflash.pair", "pydflash.results", "pydflash.config",
           "pydflash.embedded", "pydflash.cli"]


def public_callables(mod):
    for name, obj in vars(mod).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj):
            for mname, m in vars(obj).items():
                if isinstance(m, (staticmethod, classmethod)):
                    m = m.__func__
                if isinstance(m, property):
                    m = m.fget
                if inspect.isfunction(m) and (not mname.startswith("_") or mname == "__init__"):
                    yield f"{name}.{mname}", m


@pytest.mark.parametrize("modname", MODULES)
def test_public_api_is_annotated(modname):
    mod = importlib.import_module(modname)
    missing = []
    for name, fn in public_callables(mod):
        sig = inspect.signature(fn)
        params = [p for p in list(sig.parameters.values()) if p.name not in ("self", "cls")]
        if any(p.annotation is inspect.Parameter.empty for p in params):
            missing.append(name)
        elif sig.return_annotation is inspect.Signature.empty and not name.endswith("__init__"):
            missing.append(name + " (return)")
    assert not missing, missing
