#!/usr/bin/env python3
"""Stand in for the ``llama-server`` binary so that llama.cpp's own server tests
(``vendor/llama.cpp/tools/server/tests``) run against ``pydflash serve``.

The tests start ``$LLAMA_SERVER_BIN_PATH`` with llama-server's flags. This script
maps the model flags they pass (``--hf-repo``/``--hf-file``/``--model-url``/``-m``
of hub models) to local files — ``PYDFLASH_SHIM_MODEL`` / ``PYDFLASH_SHIM_DRAFT``,
else the embedded pair — drops the flags that tune what pydflash does not have
(batch sizes, the web UI, offline mode ...), and hands the rest to
``pydflash serve`` unchanged, so a flag pydflash refuses fails the test as it should.

    cd vendor/llama.cpp/tools/server/tests
    LLAMA_SERVER_BIN_PATH=$PWD/../../../../../tools/llama_server_shim.py \\
        python -m pytest unit -m "not slow" -q

With ``PYDFLASH_SHIM_EXEC`` set to a ``llama-server`` binary (built from the
vendored tree: ``python tools/build_native.py --target llama-server``), the same
mapping starts that binary instead, with every other flag unchanged: the
baseline the goal compares with, on the same local model.

Tests that need a hub model's own text (``match_regex`` on a story) fail against
any other model, llama-server included: compare with llama-server on the same
local pair, not with its published results."""

from __future__ import annotations

import os
import sys

# flags dropped with the value they take (tuning pydflash does not expose, or a hub source)
_DROP_WITH_VALUE = {
    "--hf-repo",
    "-hf",
    "-hfr",
    "--hf-file",
    "-hff",
    "--model-url",
    "-mu",
    "--batch-size",
    "-b",
    "--ubatch-size",
    "-ub",
    "--grp-attn-n",
    "--grp-attn-w",
    "--cache-ram",
    "--reasoning-format",
    "--pooling",
    "--media-path",
    "--mmproj-url",
    # features pydflash refuses: dropped here so that the server starts (llama.cpp's suite
    # starts every preset once per session); their tests then fail on the 501 answers
    "--lora",
    "--mmproj",
    "--models-dir",
    "--models-max",
    "--models-preset",
    "--tools",
    "--tools-runtime",
    "--mcp-servers-config",
    "--mcp-servers-json",
    "--spec-synth-len",
    "--spec-synth-rates",
}
# flags dropped alone
_DROP = {
    "--offline",
    "--cont-batching",
    "--swa-full",
    "--no-ui",
    "--no-mmproj",
    "--no-cache-idle-slots",
    "--backend_sampling",
    "--no-models-autoload",
    "--embedding",
    "--embeddings",
    "--reranking",
    "--context-shift",
    "--ui-mcp-proxy",
}
# llama-server's long names that pydflash spells otherwise
_RENAME = {"--n-gpu-layers": "-ngl", "--verbose": "-v", "--model-draft": "-md"}


def local_pair() -> tuple[str, str | None]:
    model = os.environ.get("PYDFLASH_SHIM_MODEL")
    if model:
        return model, os.environ.get("PYDFLASH_SHIM_DRAFT") or None
    import pydflash

    target, draft = pydflash.embedded_pair()
    return str(target), str(draft)


def translate(argv: list[str]) -> list[str]:
    """pydflash serve's arguments for llama-server's ``argv``."""
    out: list[str] = []
    model, draft = local_pair()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _DROP_WITH_VALUE:
            i += 2
            continue
        if arg in _DROP:
            i += 1
            continue
        if arg in ("--model", "-m"):  # a local file the tests downloaded: the local pair instead
            i += 2
            continue
        if arg in ("--model-draft", "-md"):
            i += 2
            continue
        out.append(_RENAME.get(arg, arg))
        i += 1
    # llama-server serves loopback origins only by default once its server tools or MCP
    # servers are on (common/arg.cpp); pydflash has neither, but keeps the rule
    tools = {"--tools", "--mcp-servers-config", "--mcp-servers-json"} & set(argv)
    if tools and "--cors-origins" not in argv:
        out += ["--cors-origins", "localhost"]
    return ["-m", model, *(["-md", draft] if draft else []), *out]


def translate_native(argv: list[str]) -> list[str]:
    """llama-server's own arguments for ``argv``: only the hub and model flags change."""
    model, _ = local_pair()
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in ("--hf-repo", "-hf", "-hfr", "--hf-file", "-hff", "--model-url", "-mu", "--model", "-m"):
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return ["-m", model, *out]


def main() -> int:
    native = os.environ.get("PYDFLASH_SHIM_EXEC")
    if native:
        os.execv(native, [native, *translate_native(sys.argv[1:])])
    args = translate(sys.argv[1:])
    os.execv(sys.executable, [sys.executable, "-m", "pydflash", "serve", *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
