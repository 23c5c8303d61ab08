"""Device, attention and KV-cache options: they reach llama.cpp, bad values
are refused before any work, and DFlash stays lossless under each of them."""

from __future__ import annotations

import logging

import pytest

import pydflash
from pydflash import Llama, _core
from pydflash.config import CACHE_TYPES, ModelConfig

PROMPT = "def read_lines(path):\n"
N = 40


@pytest.fixture(scope="module")
def pair() -> tuple[str, str]:
    return pydflash.embedded_pair()


def kv_bytes(llm: Llama, role: str) -> int:
    return sum(r.context for r in llm.memory().rows if r.role == role)


@pytest.mark.parametrize("options", [
    dict(flash_attn="on"),
    dict(flash_attn=False),
    dict(type_k="q8_0", type_v="q8_0"),                       # quantized V: flash attention turned on by auto
    dict(type_k="q4_0", flash_attn="off"),                    # quantized K alone works without it
    dict(draft_type_k="q4_0", draft_type_v="q4_0", flash_attn=True),
    dict(type_k="bf16", type_v="f32", draft_type_k="q8_0"),
    dict(n_gpu_layers=-1, draft_n_gpu_layers=-1, split_mode="none"),  # CPU-only build: stays on the CPU
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_lossless_under_each_option(pair, options):
    target, draft = pair
    with Llama(target, draft=draft, n_ctx=512, **options) as llm:
        spec = llm.generate(PROMPT, max_tokens=N, ignore_eos=True, draft_max=7)  # every step drafts
        alone = llm.generate(PROMPT, max_tokens=N, ignore_eos=True, draft_max=0)
    assert spec.tokens == alone.tokens
    assert spec.stats.n_accepted > 0  # the trained drafter still drafts something useful


def test_cache_types_size_the_kv_caches(pair):
    target, draft = pair
    with Llama(target, draft=draft, n_ctx=512) as f16:
        t16, d16 = kv_bytes(f16, "target"), kv_bytes(f16, "drafter")
    with Llama(target, draft=draft, n_ctx=512, type_k="q8_0", type_v="q8_0") as q8:
        assert kv_bytes(q8, "target") / t16 == pytest.approx(34 / 64, rel=0.02)  # q8_0: 34 bytes per 32 values
        assert kv_bytes(q8, "drafter") == d16
    with Llama(target, draft=draft, n_ctx=512, draft_type_k="q4_0", draft_type_v="q4_0") as q4:
        assert kv_bytes(q4, "target") == t16
        assert kv_bytes(q4, "drafter") / d16 == pytest.approx(18 / 64, rel=0.02)  # q4_0: 18 bytes per 32 values


@pytest.mark.parametrize("value, logged", [("on", "enabled"), ("off", "disabled"), ("auto", "auto")])
def test_flash_attn_reaches_both_contexts(pair, caplog, value, logged):
    target, draft = pair
    with caplog.at_level(logging.INFO, logger="pydflash"):
        with Llama(target, draft=draft, n_ctx=256, flash_attn=value, verbose=True):
            pass
    lines = [r.getMessage() for r in caplog.records if "flash_attn" in r.getMessage() and "=" in r.getMessage()]
    assert len(lines) == 2 and all(line.split("=")[-1].strip() == logged for line in lines), lines


def _has_gpu() -> bool:
    return any(b["type"] in ("gpu", "igpu") for b in pydflash.backends() if b["backend"] != "RPC")


@pytest.mark.skipif(_has_gpu(), reason="a GPU is present: layers are offloaded to it")
def test_n_gpu_layers_without_a_gpu_keeps_everything_on_the_cpu(pair):
    target, draft = pair
    with Llama(target, draft=draft, n_ctx=256, n_gpu_layers=-1) as llm:
        # the CPU backend's buffer types: CPU, CPU_REPACK, and on CPUs with AMX (Sapphire
        # Rapids and newer) the AMX buffer for weights in AMX tile layout
        buffers = {r.buffer.split("_")[0].upper() for r in llm.memory().rows}
        assert "CPU" in buffers and buffers <= {"CPU", "AMX", "KLEIDIAI"}, buffers


def test_backends_describe_the_cpu():
    cpu = [b for b in pydflash.backends() if b["type"] == "cpu"]
    assert len(cpu) == 1 and cpu[0]["name"] == "CPU" and cpu[0]["backend"] == "CPU"
    assert cpu[0]["memory_total"] > 0 and set(cpu[0]) == {"name", "description", "type", "backend", "memory_free",
                                                          "memory_total"}


@pytest.mark.parametrize("options, error, match", [
    (dict(split_mode="diagonal"), ValueError, "split_mode must be one of"),
    (dict(split_mode=1), TypeError, "split_mode must be a str"),
    (dict(main_gpu=-2), ValueError, "main_gpu must be >= -1"),  # -1: no GPU, as llama.cpp
    (dict(n_gpu_layers=-2), ValueError, "n_gpu_layers must be >= -1"),
    (dict(draft_n_gpu_layers=1.5), TypeError, "draft_n_gpu_layers must be an int"),
    (dict(tensor_split=(1, -1)), ValueError, "tensor_split entries must be >= 0"),
    (dict(tensor_split=(0, 0)), ValueError, "not all 0"),
    (dict(tensor_split="3,1"), TypeError, "tensor_split must be a sequence"),
    (dict(tensor_split=(1, float("nan"))), ValueError, "must be finite"),
    (dict(flash_attn="yes"), ValueError, "flash_attn must be one of"),
    (dict(type_k="q9_0"), ValueError, "type_k must be one of"),
    (dict(draft_type_v=8), TypeError, "draft_type_v must be a str"),
    (dict(type_v="q8_0", flash_attn="off"), ValueError, "type_v='q8_0' is quantized, which needs flash_attn"),
    (dict(draft_type_v="q4_0", flash_attn=False), ValueError, "draft_type_v='q4_0' is quantized"),
    (dict(rpc_servers=["localhost"]), ValueError, "rpc_servers entries must be 'host:port'"),
    (dict(rpc_servers=["h:99999"]), ValueError, "rpc_servers entries must be 'host:port'"),
    (dict(rpc_servers=[("h", 1)]), TypeError, "rpc_servers entries must be 'host:port' strings"),
])
def test_bad_options_are_refused_before_loading(pair, options, error, match):
    with pytest.raises(error, match=match):
        Llama(pair[0], draft=pair[1], **options)
    with pytest.raises(error, match=match):
        ModelConfig(**options)


def test_the_core_refuses_bad_options_too(pair):
    # the C++ layer owns the rules: nothing unchecked reaches llama.cpp, even
    # through the private module
    target = _core.Model.load(pair[0], _core.ModelParams(), "target")
    with pytest.raises(ValueError, match="type_k must be one of 'f32', 'f16'"):
        _core.ContextPair(target, None, _core.PairParams(type_k="q3_k"))
    with pytest.raises(ValueError, match="flash_attn must be one of 'auto', 'on', 'off'"):
        _core.ContextPair(target, None, _core.PairParams(flash_attn="maybe"))
    with pytest.raises(ValueError, match="type_v='q8_0' is quantized"):
        _core.ContextPair(target, None, _core.PairParams(type_v="q8_0", flash_attn="off"))
    with pytest.raises(ValueError, match="split_mode must be one of 'none', 'layer', 'row'"):
        _core.Model.load(pair[0], _core.ModelParams(split_mode="tensor"), "target")
    with pytest.raises(ValueError, match="tensor_split has 999 entries"):
        _core.Model.load(pair[0], _core.ModelParams(tensor_split=[1.0] * 999), "target")
    with pytest.raises(ValueError, match="finite and >= 0"):
        _core.Model.load(pair[0], _core.ModelParams(tensor_split=[float("inf")]), "target")
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_cx'"):
        _core.PairParams(n_cx=64)
    # and the loaded model is still fine
    pair_core = _core.ContextPair(target, None, _core.PairParams(n_ctx=64))
    pair_core.close()


def test_config_normalises_what_llama_cpp_users_pass():
    cfg = ModelConfig(flash_attn=True, rpc_servers="10.0.0.1:50052,10.0.0.2:50052", tensor_split=[3, 1])
    assert cfg.flash_attn == "on"
    assert cfg.rpc_servers == ("10.0.0.1:50052", "10.0.0.2:50052")
    assert cfg.tensor_split == (3.0, 1.0)
    assert ModelConfig(flash_attn=False).flash_attn == "off"
    assert ModelConfig(draft_n_gpu_layers=None, n_gpu_layers=7).model_params("drafter").n_gpu_layers == 7
    assert ModelConfig(draft_n_gpu_layers=0, n_gpu_layers=7).model_params("drafter").n_gpu_layers == 0
    assert set(CACHE_TYPES) >= {"f16", "q8_0", "q4_0"}
