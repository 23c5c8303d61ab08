#!/usr/bin/env python3
"""Fuzz pydflash's grammar and JSON-schema paths with atheris (libFuzzer's mutation engine).

Each input is a GBNF grammar or a JSON schema (its first byte picks which), handed to a
long-lived worker process: the schema goes through llama.cpp's converter, the grammar through
the limits (csrc/grammar_limits.cpp) and llama.cpp's parser, and a grammar that parses
constrains a short sampled generation of a tiny model (every row masked over the whole
vocabulary: llama.cpp's grammar engine runs). The only acceptable outcomes are a run, or a
``ValueError`` / ``GrammarError``. A worker that dies (a signal, an abort, a stack
overflow), hangs, or raises anything else is a finding: the input is saved under
``--findings`` and the worker restarted, so one run reports every finding.

The C++ core is not built with libFuzzer's instrumentation, so libFuzzer keeps mutating the
seeds (the grammars and schemas of the tests, the hostile shapes of issue #63 at sizes under
the limits) with stacked byte, splice and insertion mutations: a mutational fuzzer over real
grammar text, not a coverage-guided one.

    python tools/fuzz_grammar.py --runs 3000        # bounded (tests/test_fuzz_grammar.py)
    python tools/fuzz_grammar.py --seconds 1800     # a long run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRAMMARS = [
    "root ::= [a-e]+",
    'root ::= "def " [a-z_]{1,20} "(" [a-z, ]{0,24} "):"',
    'root ::= ("a" | "b" ("c" | "d")*)+ "."',
    'root ::= item ("," item)*\nitem ::= [0-9]+ | "\\"" [^"\\\\]* "\\""',
    "root ::= " + "(" * 40 + '"a"' + ")" * 40,
    "root ::= " + '"a"{0,99} ' * 8,
    "root ::= " + '"a"? ' * 60 + '"b"',
    'root ::= x\nx ::= "a" x | "b"',
    'root ::= [^\\n]* "\\n" # a comment\n',
    'root ::= <[10]> "x" !<[11]>',
    'root ::= "\\u00e9" [\\x41-\\x5A] .',
]
SCHEMAS = [
    {},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
     "required": ["name", "age"]},
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 4},
    {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$"},
    {"enum": ["red", "green", 3, None]},
    {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"},
    {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
    {"anyOf": [{"type": "string", "format": "date"}, {"type": "integer", "minimum": -5, "maximum": 1000}]},
]  # fmt: skip

WORKER = r"""
import json, sys
from pydflash import GrammarError, Llama, _core
llm = Llama(sys.argv[1], n_ctx=128, n_threads=1)
for line in sys.stdin:
    kind, text = json.loads(line)
    try:
        gbnf = _core.json_schema_to_grammar(text) if kind == "schema" else text
        if _core.grammar_error(gbnf):
            out = "refused"
        else:
            llm.generate("x", max_tokens=4, grammar=gbnf, temperature=1.0, top_k=0, seed=1)
            out = "ran"
    except (ValueError, GrammarError):
        out = "refused"
    except BaseException as e:  # anything else is a finding, reported by name
        out = "unexpected:" + type(e).__name__ + ":" + str(e).replace("\n", " ")[:200]
    print(out, flush=True)
"""


class Worker:
    """One child process that runs inputs; restarted after it dies or hangs."""

    def __init__(self, model: Path, timeout: float):
        self.model, self.timeout = model, timeout
        self.proc: subprocess.Popen | None = None

    def run(self, kind: str, text: str) -> str:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(self.model)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        proc = self.proc
        try:
            proc.stdin.write(json.dumps([kind, text]) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return f"crash (exit {proc.wait()})"
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
        if not ready:
            proc.kill()
            proc.wait()
            return f"hang (> {self.timeout:.0f} s)"
        line = proc.stdout.readline()
        return line.strip() if line else f"crash (exit {proc.wait()})"

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def seeds() -> list[bytes]:
    """The seed inputs: b"g" + GBNF, b"s" + JSON schema text."""
    return [b"g" + g.encode() for g in GRAMMARS] + [b"s" + json.dumps(s).encode() for s in SCHEMAS]


def decode(data: bytes) -> tuple[str, str]:
    """(kind, text) of an input: its first byte picks a schema ("s") or a grammar."""
    kind = "schema" if data[:1] == b"s" else "grammar"
    return kind, data[1:].decode("utf-8", "replace")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=0, help="stop after this many inputs (0: no limit)")
    ap.add_argument("--seconds", type=float, default=0, help="stop after this many seconds (0: no limit)")
    ap.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed (reproducible runs)")
    ap.add_argument("--max-len", type=int, default=16 * 1024, help="largest input in bytes")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before an input counts as a hang")
    ap.add_argument("--findings", type=Path, default=Path("fuzz-findings"), help="where failing inputs go")
    ap.add_argument("--json", type=Path, help="write the summary here as JSON")
    args = ap.parse_args(argv)
    if args.runs <= 0 and args.seconds <= 0:
        ap.error("give --runs and/or --seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import atheris  # imported here so that --help works without it

    from pydflash import gguf_writers

    work = Path(tempfile.mkdtemp(prefix="pydflash-fuzz-grammar-"))
    corpus = work / "corpus"  # libFuzzer adds to its corpus folder
    corpus.mkdir()
    bases = seeds()
    for i, s in enumerate(bases):
        (corpus / f"seed-{i:02d}").write_bytes(s)
    model = gguf_writers.write_target(work / "target.gguf", gguf_writers.TargetSpec(n_embd=16, n_layer=1, n_head=2,
                                                                          n_head_kv=1, head_dim=8, n_ff=32))
    worker = Worker(model, args.timeout)
    stats = {"runs": 0, "ran": 0, "refused": 0, "schemas": 0, "seeds": len(bases), "findings": []}
    t_start = time.monotonic()

    def finish() -> None:
        worker.close()
        stats["seconds"] = round(time.monotonic() - t_start, 1)
        stats["runs_per_second"] = round(stats["runs"] / max(stats["seconds"], 1e-9), 1)
        stats["corpus_files"] = len(list(corpus.iterdir()))
        print("\nfuzz summary: " + json.dumps({k: v for k, v in stats.items() if k != "findings"}), flush=True)
        for f in stats["findings"]:
            print(f"FINDING {f['outcome']}: {f['file']}", flush=True)
        if args.json:
            args.json.write_text(json.dumps(stats, indent=2) + "\n")
        sys.stdout.flush()
        os._exit(1 if stats["findings"] else 0)  # libFuzzer's own exit path skips Python's cleanup

    def one_input(data: bytes) -> None:
        kind, text = decode(data)
        outcome = worker.run(kind, text)
        stats["runs"] += 1
        stats["schemas"] += kind == "schema"
        if outcome in ("ran", "refused"):
            stats[outcome] += 1
        else:
            args.findings.mkdir(parents=True, exist_ok=True)
            dest = args.findings / (hashlib.sha1(data).hexdigest()[:16] + ".txt")
            dest.write_bytes(data)
            stats["findings"].append({"outcome": outcome, "file": str(dest)})
            print(f"FINDING {outcome}: saved {dest}", flush=True)
        if (args.runs and stats["runs"] >= args.runs) or (args.seconds and time.monotonic() - t_start >= args.seconds):
            finish()

    def mutate(data: bytes, max_size: int, seed: int) -> bytes:
        # from a seed chosen here (libFuzzer's schedule, with no native coverage, would favour
        # one), its kind kept; 1-4 stacked mutations of the text, sometimes a splice of another
        rng = random.Random(seed)
        base = rng.choice(bases)
        text = base[1:]
        if rng.random() < 0.2:
            other = rng.choice(bases)[1:]
            cut = rng.randrange(len(text) + 1)
            text = text[:cut] + other[rng.randrange(len(other) + 1) :]
        for _ in range(rng.randint(1, 4)):
            text = atheris.Mutate(text, max(1, min(max_size - 1, len(text) + 64)))
        return (base[:1] + text)[:max_size]

    # keep_seed: without native coverage libFuzzer would otherwise drop the seeds
    atheris.Setup([sys.argv[0], f"-seed={args.seed}", f"-max_len={args.max_len}", "-keep_seed=1",
                   "-print_final_stats=0", str(corpus)], one_input, custom_mutator=mutate)
    atheris.Fuzz()
    finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
