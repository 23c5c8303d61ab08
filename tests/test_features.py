"""Claimed features end to end: a seed reproduces a sampled generation across
processes; the CLI's device flags reach ModelConfig."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pydflash
from pydflash import Llama, cli

SAMPLE = """
import sys
from pydflash import Llama
with Llama(sys.argv[1], draft=sys.argv[2], n_ctx=256) as llm:
    r = llm.generate("x = 1", max_tokens=32, temperature=1.0, top_k=0, top_p=1.0, seed=int(sys.argv[3]),
                     ignore_eos=True)
    print(" ".join(map(str, r.tokens)))
"""


def test_a_seed_reproduces_a_sampled_generation_across_processes(spread_files):
    def sample(seed: int) -> str:
        out = subprocess.run([sys.executable, "-c", SAMPLE, *map(str, spread_files), str(seed)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip()

    first, again, other = sample(1234), sample(1234), sample(1235)
    assert len(first.split()) == 32
    assert first == again
    assert first != other  # the seed matters: this is sampling, not greedy
    with Llama(spread_files[0], n_ctx=256) as base:
        assert first != " ".join(map(str, base.generate("x = 1", max_tokens=32, ignore_eos=True).tokens))


def test_cli_device_flags_reach_model_config(llama_configs, capsys):
    seen = llama_configs
    t, d = pydflash.embedded_pair()  # head size 64: quantized KV caches fit
    rc = cli.main(["generate", "-m", t, "-d", d, "-p", "x", "-n", "2", "--ignore-eos", "--n-ctx", "256",
                   "--threads", "1", "-ngl", "0", "-ngld", "0", "-sm", "none", "-mg", "0", "-ts", "3,1",
                   "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-ctkd", "q4_0", "-ctvd", "q4_0"])
    assert rc == 0, capsys.readouterr().err
    assert len(seen) == 1
    c = seen[0]
    assert (c.n_gpu_layers, c.draft_n_gpu_layers, c.split_mode, c.main_gpu) == (0, 0, "none", 0)
    assert c.tensor_split == (3.0, 1.0) and c.flash_attn == "on"
    assert (c.type_k, c.type_v, c.draft_type_k, c.draft_type_v) == ("q8_0", "q8_0", "q4_0", "q4_0")
    assert (c.n_ctx, c.n_threads) == (256, 1)
    # other values, and the defaults when no flag is given
    seen.clear()
    assert cli.main(["generate", "-m", t, "-p", "x", "-n", "1", "-ngl", "-1", "-sm", "row", "-mg", "1",
                     "-fa", "off", "-ctk", "bf16", "-ctv", "f32"]) == 0
    c = seen[0]
    assert (c.n_gpu_layers, c.split_mode, c.main_gpu, c.flash_attn, c.type_k, c.type_v) == (
        -1, "row", 1, "off", "bf16", "f32")
    assert c.draft_n_gpu_layers is None  # -ngld defaults to -ngl
    seen.clear()
    assert cli.main(["generate", "-m", t, "-p", "x", "-n", "1"]) == 0
    from pydflash.config import ModelConfig

    defaults = ModelConfig()
    for f in ("n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "flash_attn", "type_k", "type_v",
              "draft_type_k", "draft_type_v", "rpc_servers"):
        assert getattr(seen[0], f) == getattr(defaults, f), f


@pytest.mark.parametrize("flag, value", [("-sm", "diagonal"), ("-fa", "yes"), ("-ctk", "q9_0"), ("-ngl", "x")])
def test_cli_refuses_bad_device_flags(spread_files, capsys, flag, value):
    with pytest.raises(SystemExit) as info:
        cli.main(["generate", "-m", str(spread_files[0]), "-p", "x", flag, value])
    assert info.value.code == 2
    assert flag in capsys.readouterr().err
