"""Negative values on the command line (issue #65). Every numeric flag of every
subcommand reads ``-1`` as its value, never as an option; what llama.cpp gives a
negative value (``-n -1`` until EOS or a full context, ``-t -1`` all cores, ``--temp -1``
greedy, ``-np -1`` llama-server's auto slots, ...) it means here too; a negative that
means nothing is refused by the option's name before any model loads. No model is
loaded: the commands' own option builders are called."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from pydflash import Llama, cli
from pydflash.cli import build_parser
from pydflash.cli.main import generate_options
from pydflash.cli.serve import serve_llama_options, server_options
from pydflash.config import ModelConfig, SamplingConfig


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    root = build_parser()
    (sub,) = (a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _numeric_flags() -> list[tuple[str, str, str, type]]:
    """(subcommand, flag, dest, type) for every int or float flag of the whole parser."""
    out = []
    for name, parser in _subparsers().items():
        for action in parser._actions:
            if action.option_strings and action.type in (int, float):
                out.extend((name, flag, action.dest, action.type) for flag in action.option_strings)
    return out


FLAGS = _numeric_flags()
# a placeholder for each option a command requires (train-drafter's -m and -o)
REQUIRED = {
    name: [x for a in p._actions if a.required and a.option_strings for x in (a.option_strings[0], "x")]
    for name, p in _subparsers().items()
}


def test_the_sweep_covers_every_command_and_llama_cpps_short_flags():
    seen = {(cmd, flag) for cmd, flag, _, _ in FLAGS}
    assert {cmd for cmd, _ in seen} == {"generate", "demo", "bench", "serve", "rpc-server", "train-drafter"}
    for flag in ("-n", "-t", "-tb", "-ngl", "-ngld", "-mg", "-c", "-b", "-ub", "-s", "--temp", "--top-k"):
        assert ("generate", flag) in seen, flag
    for flag in ("-n", "-np", "-ngl", "-s", "--temp", "--top-k", "--sleep-idle-seconds", "--spec-draft-n-max"):
        assert ("serve", flag) in seen, flag


@pytest.mark.parametrize(("command", "flag", "dest", "kind"), FLAGS, ids=[f"{c} {f}" for c, f, _, _ in FLAGS])
def test_minus_one_is_the_flags_value(command: str, flag: str, dest: str, kind: type):
    for value in ("-1", "-1.5") if kind is float else ("-1",):
        a = build_parser().parse_args([command, *REQUIRED[command], flag, value])
        assert getattr(a, dest) == kind(value)


def _generate(*argv: str) -> tuple[ModelConfig, dict]:
    """generate's Llama options (as the ModelConfig they make) and its generate() options."""
    llama, kw = generate_options(build_parser().parse_args(["generate", *argv]))
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in llama.items() if k in fields}), kw


def _sampling(*argv: str) -> SamplingConfig:
    return SamplingConfig.build(**_generate(*argv)[1])


def test_generate_reads_negative_values_as_llama_cpp_does():
    assert _sampling("-n", "-1").max_tokens is None  # -1: until EOS or the context is full
    assert _sampling("-n", "-2").max_tokens is None  # llama-cli's "until the context is filled"
    cfg, _ = _generate("-t", "-1", "-tb", "-1")
    assert cfg.n_threads is None and cfg.n_threads_batch is None  # all cores
    assert _generate("-t", "0")[0].n_threads is None
    assert _sampling("--temp", "-1").temperature == 0.0  # llama.cpp clamps it: greedy
    assert _sampling("--top-k", "-1").top_k == 0  # off
    # -1: the context, which the command reads from the loaded model (test_generate_repeat_last_n...)
    assert _generate("--repeat-last-n", "-1")[1]["penalty_last_n"] == -1
    cfg, _ = _generate("-ngl", "-1", "-ngld", "-1")
    assert cfg.n_gpu_layers == -1 and cfg.draft_n_gpu_layers == -1  # all layers
    assert _generate("-mg", "-1", "-sm", "none")[0].main_gpu == -1  # no GPU: the CPU
    cfg, kw = _generate("-s", "-1")
    assert cfg.seed == -1 and kw["seed"] == -1  # random
    assert _sampling("--top-nsigma", "-1").top_n_sigma == -1.0  # off


def test_generate_repeat_last_n_minus_one_is_the_context(monkeypatch: pytest.MonkeyPatch, capsys):
    windows = []
    generate = Llama.generate

    def recording(self: Llama, prompt: str, **kw: object):
        windows.append(kw["penalty_last_n"])
        return generate(self, prompt, **kw)

    monkeypatch.setattr(Llama, "generate", recording)
    rc = cli.main(["generate", "-n", "2", "-c", "64", "-t", "1", "--repeat-last-n", "-1", "--repeat-penalty", "1.1"])
    assert rc == 0, capsys.readouterr().err
    assert windows == [64]  # the sequence's whole context


@pytest.mark.parametrize(
    ("flag", "option"),
    [("-n", "max_tokens"), ("-b", "n_batch"), ("-ub", "n_ubatch"), ("--draft-max", "draft_max"),
     ("--draft-min", "draft_min"), ("--draft-window", "draft_window"), ("--rope-freq-base", "rope_freq_base"),
     ("--draft-p-min", "draft_p_min"), ("--spec-ngram-mod-n-max", "mod_n_max")],
)  # fmt: skip
def test_a_negative_that_means_nothing_is_refused_by_name(flag: str, option: str):
    value = "-5" if flag == "-n" else "-1"  # -n: -1 and -2 have meanings
    with pytest.raises(ValueError, match=option):
        _sampling(flag, value, "--spec-type", "ngram-mod")


def _serve(*argv: str) -> tuple[dict, dict]:
    a = build_parser().parse_args(["serve", *argv])
    return server_options(a), serve_llama_options(a)


def test_serve_reads_negative_values_as_llama_server_does():
    server, llama = _serve("-n", "-1", "--temp", "-1", "--top-k", "-1", "-s", "-1", "--sleep-idle-seconds", "-1")
    assert "max_tokens" not in server["defaults"]  # -1: until EOS or the context is full
    assert server["defaults"]["temperature"] == 0.0 and server["defaults"]["top_k"] == 0
    assert server["defaults"]["seed"] == -1 and server["sleep_idle_seconds"] is None
    _, llama = _serve("-np", "-1")  # llama-server's auto: 4 slots sharing one KV cache
    assert (llama["n_parallel"], llama["kv_unified"]) == (4, True)
    _, llama = _serve("-np", "3", "-t", "-1")
    assert (llama["n_parallel"], llama["kv_unified"], llama["n_threads"]) == (3, False, None)
    with pytest.raises(ValueError, match="parallel"):
        _serve("-np", "0")


TRAIN_FLAGS = [(flag, dest) for cmd, flag, dest, _ in FLAGS if cmd == "train-drafter" and flag.startswith("--")]


@pytest.mark.parametrize(("flag", "dest"), TRAIN_FLAGS, ids=[f for f, _ in TRAIN_FLAGS])
def test_train_drafter_refuses_a_negative_by_the_options_name(flag: str, dest: str):
    # llama.cpp has no meaning for these: refused before any model loads or anything is written
    from pydflash.train import TrainingInputError
    from pydflash.train.config import TrainConfig

    a = build_parser().parse_args(["train-drafter", "-m", "t.gguf", "-o", "d.gguf", flag, "-1"])
    opts = {f.name: getattr(a, f.name) for f in dataclasses.fields(TrainConfig) if f.name not in ("target", "output")}
    with pytest.raises(TrainingInputError, match=dest):
        TrainConfig.build("t.gguf", "d.gguf", **opts)
