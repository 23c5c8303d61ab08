"""The drafter's context window (``Llama(..., draft_window=N)``): the drafter
attends to, and keeps in its KV cache, the target features of the last N
positions only. It changes what the drafter sees, never the output: greedy
decoding stays the target's own at every context length, with one or several
sequences, through the prompt cache and slot files, on a hybrid target; the
drafter's memory stays flat as n_ctx grows. A drafter that carries its own
sliding window (llama.cpp's converter writes dflash.attention.sliding_window
for use_swa checkpoints) gets a window-sized cache without being asked."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pydflash
from pydflash import Llama, _core, cli, gguf_writers
from pydflash.bench import workload
from pydflash.config import ModelConfig
from support.models import HYBRID_DRAFTERS, HYBRID_TARGETS

TARGET = gguf_writers.TargetSpec()
B8 = gguf_writers.DrafterSpec()  # block 8
SWA = 64  # the sliding window of the drafter that carries one
N_OUT = 48


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("window")
    gguf_writers.write_pair(d, TARGET, B8)
    swa = dataclasses.replace(B8, n_layer=2, variant=gguf_writers.DrafterVariant(sliding_window=SWA))
    gguf_writers.write_drafter(d / "swa-drafter.gguf", TARGET, swa)
    for kind in ("dflash2", "dspark"):
        gguf_writers.write_drafter(
            d / f"{kind}-drafter.gguf", TARGET, dataclasses.replace(B8, variant=gguf_writers.DrafterVariant(kind=kind))
        )
    gguf_writers.write_hybrid_pair(d, HYBRID_TARGETS["qwen35"], HYBRID_DRAFTERS["b8"])
    return d


def prompt_of(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 300) for _ in range(n)]


@pytest.fixture(scope="module")
def reference(models):
    """The target's own greedy continuation of a prompt (cached)."""
    llms: dict[str, Llama] = {}
    cache: dict[tuple[str, int, int], list[int]] = {}

    def ref(n: int, seed: int = 0, target: str = "tiny-target.gguf") -> list[int]:
        if (target, n, seed) not in cache:
            if target not in llms:
                llms[target] = Llama(models / target, n_ctx=4096, n_threads=1)
            res = llms[target].generate(prompt_of(n, seed), max_tokens=N_OUT, ignore_eos=True)
            cache[(target, n, seed)] = res.tokens
        return cache[(target, n, seed)]

    yield ref
    for llm in llms.values():
        llm.close()


def open_pair(models, drafter: str = "tiny-drafter.gguf", target: str = "tiny-target.gguf", **kw) -> Llama:
    kw.setdefault("n_ctx", 4096)
    return Llama(models / target, draft=models / drafter, n_threads=1, draft_adaptive=False, **kw)


def drafter_memory(llm: Llama) -> tuple[int, int]:
    rows = [r for r in llm.memory().rows if r.role == "drafter"]
    return sum(r.context for r in rows), sum(r.compute for r in rows)


@pytest.mark.parametrize("window", [8, 24, 200])
@pytest.mark.parametrize("n_prompt", [40, 300, 1500])
def test_lossless_at_every_context_length(models, reference, window, n_prompt):
    with open_pair(models, draft_window=window) as llm:
        assert llm.pair.draft_window == window
        res = llm.generate(prompt_of(n_prompt), max_tokens=N_OUT, ignore_eos=True)
    assert res.tokens == reference(n_prompt)
    assert res.stats.n_drafted > 0


def test_a_window_changes_what_the_drafter_sees_only_once_it_cuts(models, reference):
    def run(window):
        with open_pair(models, draft_window=window) as llm:
            res = llm.generate(prompt_of(600), max_tokens=N_OUT, ignore_eos=True)
        assert res.tokens == reference(600)
        return [(s.n_drafted, s.n_accepted) for s in res.stats.steps]

    whole = run(0)
    assert run(None) == whole  # the default window (4096) holds this whole context
    assert run(1024) == whole  # wider than prompt + output: nothing ever leaves the window
    assert run(16) != whole  # 16 positions: the drafter's blocks are drafted on less


@pytest.mark.parametrize("drafter", ["dflash2-drafter.gguf", "dspark-drafter.gguf"])
def test_lossless_for_the_other_drafter_kinds(models, drafter):
    with Llama(models / "tiny-target.gguf", n_ctx=2048, n_threads=1) as base:
        want = base.generate(prompt_of(700), max_tokens=N_OUT, ignore_eos=True).tokens
    with open_pair(models, drafter, n_ctx=2048, draft_window=32) as llm:
        res = llm.generate(prompt_of(700), max_tokens=N_OUT, ignore_eos=True)
    assert res.tokens == want and res.stats.n_drafted > 0


def test_several_sequences(models, reference):
    prompts = [prompt_of(n, seed) for n, seed in ((900, 0), (50, 1), (400, 2))]
    with open_pair(models, n_ctx=4096, n_parallel=3, draft_window=32) as llm:
        results = llm.generate_batch(prompts, max_tokens=N_OUT, ignore_eos=True)
    for (n, seed), res in zip(((900, 0), (50, 1), (400, 2)), results, strict=True):
        assert res.tokens == reference(n, seed)


def test_stacked_drafting_adaptive_lengths_and_external_drafts(models, reference):
    # n-gram drafts first, the drafter otherwise; the default adaptive draft length
    # (a calibration pass on the windowed drafter context); DSpark blocks padded
    # to one length across two sequences
    prompts = [prompt_of(700, 0), prompt_of(50, 1)]
    kw = dict(n_ctx=2048, n_threads=1, draft_window=16)
    with Llama(models / "tiny-target.gguf", draft=models / "tiny-drafter.gguf", **kw,
               speculative=["ngram-simple", "draft-dflash"]) as llm:  # fmt: skip
        assert llm.generate(prompts[0], max_tokens=N_OUT, ignore_eos=True).tokens == reference(700)
    with Llama(models / "tiny-target.gguf", draft=models / "dspark-drafter.gguf", n_parallel=2, **kw,
               speculative=["draft-dspark"]) as llm:  # fmt: skip
        # pinned: adaptive lengths follow timings, and so would how the two sequences'
        # rows are batched (which moves near-ties, test_parallel.py)
        results = llm.generate_batch(prompts, max_tokens=N_OUT, ignore_eos=True, draft_max=llm.pair.max_draft)
    assert [r.tokens for r in results] == [reference(700), reference(50, 1)]
    # an external draft longer than the window: its kept rows still leave a window of 16
    with open_pair(models, n_ctx=2048, draft_window=16) as llm:
        pair = llm.pair
        pair.prefill(prompt_of(700))
        want = reference(700)
        step = pair.step(draft=want[:39])  # the target's own next tokens: all accepted
        assert step.tokens == want[:40] and step.n_accepted == 39
        out = list(step.tokens)
        while len(out) < N_OUT:
            out += pair.step().tokens
        assert out[:N_OUT] == want


def test_hybrid_target(models):
    prompt = prompt_of(500)
    with Llama(models / "hybrid-target.gguf", n_ctx=1024, n_threads=1) as base:
        want = base.generate(prompt, max_tokens=N_OUT, ignore_eos=True).tokens
    for rollback in ("auto", "checkpoint"):
        with open_pair(
            models, "hybrid-drafter.gguf", "hybrid-target.gguf", n_ctx=1024, draft_window=24, rollback=rollback
        ) as llm:
            res = llm.generate(prompt, max_tokens=N_OUT, ignore_eos=True)
        assert res.tokens == want, rollback
        assert res.stats.n_drafted > 0


def test_drafter_memory_is_flat_as_n_ctx_grows(models):
    windowed, whole = [], []
    for n_ctx in (1024, 4096, 16384):
        with open_pair(models, n_ctx=n_ctx, draft_window=64) as llm:
            windowed.append(drafter_memory(llm))
        with open_pair(models, n_ctx=n_ctx) as llm:
            whole.append(drafter_memory(llm))
    assert windowed[0] == windowed[1] == windowed[2]
    assert whole[0][0] < whole[1][0] < whole[2][0]  # the KV cache of the whole context
    assert windowed[2][0] * 16 <= whole[2][0]
    with open_pair(models, n_ctx=4096, n_parallel=4, draft_window=64) as llm:  # one ring per sequence
        assert windowed[0][0] < drafter_memory(llm)[0] < whole[1][0]


def test_the_default_window(models, reference):
    assert _core.DEFAULT_DRAFT_WINDOW == 4096
    mem = {}
    for n_ctx in (2048, 4096, 8192, 16384):
        with open_pair(models, n_ctx=n_ctx) as llm:
            # a slot no longer than the window: no window at all (nothing would leave it)
            assert llm.pair.draft_window == (4096 if n_ctx > 4096 else 0)
            mem[n_ctx] = drafter_memory(llm)
            if n_ctx == 8192:
                assert llm.generate(prompt_of(300), max_tokens=N_OUT, ignore_eos=True).tokens == reference(300)
    assert mem[2048][0] < mem[4096][0]
    assert mem[8192] == mem[16384]  # flat past the window
    with open_pair(models, n_ctx=8192, n_parallel=2) as llm:  # 4096 per sequence: within the window
        assert llm.pair.draft_window == 0


def greedy_after(pair, prompt: list[int], *, reuse: bool) -> tuple[list, int]:
    """The next tokens and each step's accepted count (test_prompt_cache.py: drafted
    tokens may differ at a near-tie, the target's features coming from other
    batches), and n_cached."""
    pair.prefill(prompt, reuse=reuse)
    cached = pair.n_cached
    out: list[int] = []
    accepted: list[int] = []
    while len(out) < 24:
        step = pair.step()
        out += step.tokens
        accepted.append(step.n_accepted)
    return [out[:24], accepted], cached


@pytest.mark.parametrize("drafter", ["tiny-drafter.gguf", "swa-drafter.gguf"])
def test_prompt_cache_keeps_the_targets_prefix(models, drafter):
    # a window never costs the target its cached prefix: the next prompt keeps what it
    # repeats, as without a window; after a cut the drafter starts over from what it
    # still holds (fewer drafts kept for a while), the output is the target's own
    rng = random.Random(3)
    window = 24 if drafter == "tiny-drafter.gguf" else SWA
    kinds = set()
    with (
        open_pair(models, drafter, n_ctx=1024, draft_window=window) as llm,
        open_pair(models, drafter, n_ctx=1024, draft_window=window) as fresh,
    ):
        pair = llm.pair
        for _ in range(10):
            pair.prefill(prompt_of(rng.randint(10, 200), rng.randrange(99)))
            for _ in range(rng.randint(0, 5)):
                pair.step()
            held = pair.tokens
            kind = rng.choice(["extend", "cut", "shorter"])
            kinds.add(kind)
            if kind == "extend":
                prompt = held + prompt_of(rng.randint(1, 60), rng.randrange(99))
            elif kind == "shorter":
                prompt = held[: rng.randint(2, len(held))]
            else:
                prompt = held[: rng.randrange(1, len(held))] + prompt_of(rng.randint(1, 40), rng.randrange(99))
            got, cached = greedy_after(pair, prompt, reuse=True)
            want, _ = greedy_after(fresh.pair, prompt, reuse=False)
            n_past = len(held) - 1
            common = 0
            while common < min(n_past, len(prompt) - 1) and held[common] == prompt[common]:
                common += 1
            assert cached == common, (kind, cached, common)
            assert got[0] == want[0], kind  # the tokens
            if kind == "extend":
                assert got[1] == want[1]  # a next turn loses nothing of the window: same accepted counts
    assert kinds == {"extend", "cut", "shorter"}


@pytest.mark.parametrize("drafter, window", [("tiny-drafter.gguf", 32), ("swa-drafter.gguf", None)])
def test_slot_files_carry_the_window(models, tmp_path, drafter, window):
    prompt = prompt_of(300)
    with open_pair(models, drafter, n_ctx=1024, draft_window=window) as a:
        a.pair.prefill(prompt)
        a.save_slot(0, tmp_path / "slot")
        want = [a.pair.step().tokens for _ in range(6)]
    with open_pair(models, drafter, n_ctx=1024, draft_window=window) as b:
        b.load_slot(0, tmp_path / "slot")
        assert [b.pair.step().tokens for _ in range(6)] == want
    seen = window or SWA
    with (
        open_pair(models, drafter, n_ctx=1024, draft_window=16) as c,
        pytest.raises(ValueError, match=f"draft window {seen}"),
    ):
        c.load_slot(0, tmp_path / "slot")


def test_a_drafter_with_its_own_sliding_window_gets_a_window_sized_cache(models, reference, caplog):
    mem = []
    with caplog.at_level(logging.INFO, logger="pydflash"):
        for n_ctx in (1024, 4096, 16384):
            with open_pair(models, "swa-drafter.gguf", n_ctx=n_ctx, verbose=True) as llm:
                assert llm.pair.draft_window == SWA  # its own window by default
                mem.append(drafter_memory(llm))
                if n_ctx == 4096:
                    res = llm.generate(prompt_of(300), max_tokens=N_OUT, ignore_eos=True)
                    assert res.tokens == reference(300) and res.stats.n_drafted > 0
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "creating     SWA KV cache" in logged
    assert "full-size SWA cache" not in logged
    assert mem[0] == mem[1] == mem[2]
    # a narrower window on top of it; never a wider one
    with open_pair(models, "swa-drafter.gguf", n_ctx=4096, draft_window=16) as llm:
        assert llm.pair.draft_window == 16
        assert drafter_memory(llm)[0] <= mem[0][0]
        assert llm.generate(prompt_of(300), max_tokens=N_OUT, ignore_eos=True).tokens == reference(300)
    with open_pair(models, "swa-drafter.gguf", draft_window=0) as llm:
        assert llm.pair.draft_window == SWA  # 0 adds no window of ours; its own stays
    with pytest.raises(ValueError, match=f"wider than this drafter's own sliding window of {SWA}"):
        open_pair(models, "swa-drafter.gguf", draft_window=SWA + 1)


def test_bad_windows_are_typed_errors(models):
    target = models / "tiny-target.gguf"
    with pytest.raises(ValueError, match="draft_window must be >= 0"):
        Llama(target, draft=models / "tiny-drafter.gguf", draft_window=-1)
    with pytest.raises(TypeError, match="draft_window must be an int"):
        ModelConfig(draft_window=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="draft_window must be an int"):
        ModelConfig(draft_window=True)
    with pytest.raises(ValueError, match="smaller than the drafter's block of 8 tokens; use at least 8"):
        open_pair(models, draft_window=7)
    with pytest.raises(ValueError, match="no drafter is loaded: pass draft="):
        Llama(target, n_ctx=256, draft_window=64)
    with Llama(target, n_ctx=256, draft_window=0) as llm:  # 0 and None mean no window: fine alone
        assert llm.pair.draft_window == 0


def test_cli_flag_reaches_the_config(models, llama_configs, capsys):
    seen = llama_configs
    t, d = str(models / "tiny-target.gguf"), str(models / "tiny-drafter.gguf")
    for flags, want in (([], None), (["--draft-window", "64"], 64)):
        assert (
            cli.main(["generate", "-m", t, "-d", d, "-p", "x", "-n", "4", "--ignore-eos", "--n-ctx", "512", *flags])
            == 0
        ), capsys.readouterr().err
        assert seen.pop().draft_window == want


# A drafter as a new user gets it: an HF-format DFlash checkpoint with use_swa /
# swa_window_size, converted by the vendored llama.cpp converter (its
# tokenizer-hash check patched: this tiny BPE is not one it knows).
LLAMA_CPP = Path(__file__).resolve().parents[1] / "vendor" / "llama.cpp"
CONVERT = """import runpy, sys
sys.path[:0] = [sys.argv[1] + "/gguf-py", sys.argv[1]]
import conversion.base as b
b.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
ll, ddir, tdir, out = sys.argv[1:5]
sys.argv = ["convert_hf_to_gguf.py", ddir, "--target-model-dir", tdir, "--outfile", out, "--outtype", "f32"]
runpy.run_path(ll + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def write_hf_checkpoint(d: Path, window: int) -> tuple[Path, Path]:
    """The tiny target's tokenizer and config in HF format, and a random 2-layer
    DFlash drafter checkpoint for it (safetensors) with a sliding window."""
    torch = pytest.importorskip("torch")
    tokenizers = pytest.importorskip("tokenizers")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    tdir, ddir = d / "target-hf", d / "drafter-hf"
    tdir.mkdir()
    ddir.mkdir()
    tok = gguf_writers.tokenizer(TARGET.n_vocab)
    bpe = tokenizers.models.BPE(
        vocab={t: i for i, t in enumerate(tok.tokens[: tok.eos])}, merges=[tuple(m.split(" ")) for m in tok.merges]
    )
    hf = tokenizers.Tokenizer(bpe)
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = tokenizers.decoders.ByteLevel()
    hf.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in tok.tokens[tok.eos :]])
    hf.save(str(tdir / "tokenizer.json"))
    eos = tok.tokens[tok.eos]
    (tdir / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos})
    )
    s = TARGET
    cfg = dict(hidden_size=s.n_embd, num_attention_heads=s.n_head, num_key_value_heads=s.n_head_kv, head_dim=s.head_dim,
               intermediate_size=s.n_ff, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=s.n_ctx,
               vocab_size=s.n_vocab, tie_word_embeddings=False, hidden_act="silu", model_type="qwen3")  # fmt: skip
    target_cfg = {**cfg, "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": s.n_layer}
    (tdir / "config.json").write_text(json.dumps(target_cfg))
    dflash = {"mask_token_id": tok.mask, "target_layer_ids": [0, 2], "block_size": 8, "use_swa": True,
              "swa_window_size": window}  # fmt: skip
    drafter_cfg = {**cfg, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 2, "dflash_config": dflash}
    (ddir / "config.json").write_text(json.dumps(drafter_cfg))
    g = torch.Generator().manual_seed(0)
    E, H, KV, D, F = s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_ff
    shapes = {"self_attn.q_proj": (H * D, E), "self_attn.k_proj": (KV * D, E), "self_attn.v_proj": (KV * D, E),
              "self_attn.o_proj": (E, H * D), "mlp.gate_proj": (F, E), "mlp.up_proj": (F, E),
              "mlp.down_proj": (E, F)}  # fmt: skip
    norms = {"input_layernorm": E, "post_attention_layernorm": E, "self_attn.q_norm": D, "self_attn.k_norm": D}
    t = {"fc.weight": torch.randn(E, 2 * E, generator=g) * 0.1, "hidden_norm.weight": torch.ones(E),
         "norm.weight": torch.ones(E)}  # fmt: skip
    for i in range(2):
        t.update({f"layers.{i}.{k}.weight": torch.randn(*v, generator=g) * 0.2 for k, v in shapes.items()})
        t.update({f"layers.{i}.{k}.weight": torch.ones(n) for k, n in norms.items()})
    safetensors_torch.save_file(t, str(ddir / "model.safetensors"))
    return tdir, ddir


def test_a_drafter_converted_by_llama_cpps_converter(tmp_path, caplog):
    for module in ("transformers", "sentencepiece"):  # the converter's own requirements
        pytest.importorskip(module)
    if not (LLAMA_CPP / "convert_hf_to_gguf.py").is_file():
        pytest.skip("no vendored llama.cpp converter (vendor/llama.cpp)")
    tdir, ddir = write_hf_checkpoint(tmp_path, window=SWA)
    drafter = tmp_path / "drafter.gguf"
    run = subprocess.run([sys.executable, "-c", CONVERT, str(LLAMA_CPP), str(ddir), str(tdir), str(drafter)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    target = gguf_writers.write_target(tmp_path / "target.gguf", TARGET)
    prompt = prompt_of(300)
    with Llama(target, n_ctx=1024, n_threads=1) as base:
        want = base.generate(prompt, max_tokens=N_OUT, ignore_eos=True).tokens
    mem = []
    with caplog.at_level(logging.INFO, logger="pydflash"):
        for n_ctx in (1024, 4096):
            with Llama(target, draft=drafter, n_ctx=n_ctx, n_threads=1, draft_adaptive=False, verbose=True) as llm:
                assert llm.pair.draft_window == SWA
                res = llm.generate(prompt, max_tokens=N_OUT, ignore_eos=True)
                assert res.tokens == want and res.stats.n_drafted > 0
                mem.append(drafter_memory(llm))
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "creating     SWA KV cache" in logged and "full-size SWA cache" not in logged
    assert mem[0] == mem[1]


def with_sliding_window(src: str, dst: Path, window: int) -> Path:
    """A copy of drafter ``src`` with its own sliding window on every layer (the
    keys llama.cpp's converter writes for a use_swa checkpoint)."""
    import gguf

    from pydflash.gguf_writers.padding import _copy_field

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), "dflash")
    for name, field in r.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            _copy_field(w, name, field)
    w.add_sliding_window(window)
    w.add_sliding_window_pattern([True] * int(r.fields["dflash.block_count"].parts[-1][0]))
    for t in r.tensors:
        w.add_tensor(t.name, np.ascontiguousarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_a_sliding_window_drafter_drafts_as_llama_cpps_own_loop(tmp_path):
    # llama.cpp's loop gives a drafter's own sliding window a window-sized cache too
    # (common's swa_full is off): on the embedded pair (clear margins) with its
    # drafter given a 64-position window, every step drafts and accepts what
    # llama.cpp's does, over a prompt several windows long
    from support.native_loop import matches_native, native_steps

    target, drafter = pydflash.embedded_pair()
    swa = with_sliding_window(drafter, tmp_path / "swa.gguf", SWA)
    prompt = workload.heldout_stdlib_text()[:3000]
    with Llama(target, draft=swa, n_ctx=2048, n_threads=1) as llm:
        assert llm.pair.draft_window == SWA and len(llm.tokenize(prompt)) > 4 * SWA
        res = llm.generate(prompt, max_tokens=100, draft_max=7, ignore_eos=True)
        with Llama(target, draft=drafter, n_ctx=2048, n_threads=1) as whole:
            other = whole.generate(prompt, max_tokens=100, draft_max=7, ignore_eos=True)
    ours = [(s.n_accepted, s.n_drafted) for s in res.stats.steps]
    assert res.tokens == other.tokens
    # the window changes what is drafted (the counts may agree: acceptance is low here)
    assert [s.drafted for s in res.stats.steps] != [s.drafted for s in other.stats.steps]
    matches_native(ours, native_steps(target, prompt, 100, "draft-dflash", draft=swa))
