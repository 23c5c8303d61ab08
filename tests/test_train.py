"""pydflash.train: the whole path on a tiny target (its own replies, features
captured through llama.cpp, a few training steps, the GGUF written, loaded and
lossless), resume exactness, the bad inputs refused before anything is written,
and the layout llama.cpp's own loop loads."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pydflash import ChatTemplateError, DraftCompatibilityError, Llama, _core, gguf_writers, inspect_gguf
from pydflash import errors as pydflash_errors

torch = pytest.importorskip("torch", reason="the train extra (torch) is not installed")

from pydflash.train import PromptsFileError, TrainingInputError, train_drafter  # noqa: E402
from pydflash.train.loop import Checkpoint  # noqa: E402

# a target whose greedy replies are not constant: enough hot tokens, a clear argmax margin
TARGET = gguf_writers.TargetSpec(n_embd=64, n_layer=4, hot_tokens=24, head_scale=6.0, seed=3)
CHATML = (
    "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
FAST = dict(max_response=24, eval_prompts=3, eval_tokens=12, threads=1, progress=False, anchors=8,
            batch_tokens=256, layers=1, taps=2)  # fmt: skip


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gguf_writers.write_target(tmp_path_factory.mktemp("train") / "target.gguf", TARGET)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    words = "the of and to in is it you that he was for on are with as his they be at one have this from".split()
    rng = np.random.default_rng(0)
    p.write_text("\n".join(" ".join(rng.choice(words, 6)) for _ in range(24)) + "\n")
    return p


def _no_partial_files(folder: Path) -> None:
    assert not [f for f in folder.iterdir() if f.name.endswith(".partial")]


def test_the_whole_path_trains_writes_a_lossless_drafter(tmp_path, target, prompts):
    out = tmp_path / "drafter.gguf"
    r = train_drafter(target, out, prompts=prompts, steps=20, eval_every=10, cache_dir=tmp_path / "cache", **FAST)
    assert out.is_file() and r.output == out
    assert r.steps == 20 and [p.step for p in r.curve] == [0, 10, 20]
    assert r.lossless and all(p.tau >= 1.0 for p in r.curve)
    assert r.best_tau == max(p.tau for p in r.curve)
    # upstream's layout: the target's tokenizer, the mask token, llama.cpp's layer ids, no embedding or head
    info = inspect_gguf(out)
    md = info["metadata"]
    assert info["architecture"] == "dflash" and md["dflash.block_size"] == "8"
    assert md["dflash.target_layers"] == str(list(r.shape.target_layers))
    assert int(md["tokenizer.ggml.mask_token_id"]) == r.shape.mask_token
    assert "token_embd.weight" not in info["tensor_names"] and "output.weight" not in info["tensor_names"]
    # the file drafts for the target, and DFlash's output is the target's own
    with Llama(target, n_ctx=512, n_threads=1) as alone, Llama(target, draft=out, n_ctx=512, n_threads=1,
                                                               draft_max=7) as spec:  # fmt: skip
        for text in ("the of and", "you that he was"):
            a = alone.generate(text, max_tokens=32, ignore_eos=True)
            d = spec.generate(text, max_tokens=32, ignore_eos=True)
            assert d.tokens == a.tokens
            assert d.stats.n_drafted > 0
    _no_partial_files(tmp_path)


def test_resume_continues_exactly_where_a_killed_run_stopped(tmp_path, target, prompts):
    common = [sys.executable, "-m", "pydflash", "train-drafter", "-m", str(target), "--prompts", str(prompts),
              "--steps", "16", "--eval-every", "4", "--max-response", "24", "--eval-prompts", "3", "--eval-tokens",
              "12", "--threads", "1", "--anchors", "8", "--batch-tokens", "256", "--layers", "1", "--taps", "2",
              "--no-progress", "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    whole = tmp_path / "whole.gguf"
    subprocess.run([*common, "-o", str(whole)], check=True, timeout=300)
    killed = tmp_path / "killed.gguf"
    proc = subprocess.Popen([*common, "-o", str(killed)])
    runs = tmp_path / "cache"
    try:
        while proc.poll() is None:  # kill it once a checkpoint past the first one is on disk
            cks = list(runs.glob("*/runs/*/checkpoint.pt"))
            if any(Checkpoint.load(c).step >= 8 and c.parent != _run_of(runs, whole) for c in cks):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
    finally:
        proc.wait(timeout=300)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    stopped_at = Checkpoint.load(_run_of(runs, killed) / "checkpoint.pt").step
    assert 8 <= stopped_at < 16
    subprocess.run([*common, "-o", str(killed), "--resume"], check=True, timeout=300)
    a = Checkpoint.load(_run_of(runs, whole) / "checkpoint.pt").losses
    b = Checkpoint.load(_run_of(runs, killed) / "checkpoint.pt").losses
    assert len(a) == len(b) == 16
    assert abs(a[stopped_at] - b[stopped_at]) < 1e-4  # the first step after the resume
    assert np.allclose(a, b, atol=1e-4)


def test_chunks_made_for_other_target_layers_are_reused(tmp_path, target, prompts):
    """The replies are the costly part: a run that reads other layers keeps the cached chunks and
    captures only their features, as the pass that generated them would have given them."""
    cache = tmp_path / "cache"
    kw = {**FAST, "steps": 2, "eval_every": 2, "cache_dir": cache, "prompts": prompts}
    train_drafter(target, tmp_path / "a.gguf", **kw)
    chunks = sorted(cache.glob("*/data-*/*.npz"))
    stamps = [c.stat().st_mtime_ns for c in chunks]
    r = train_drafter(target, tmp_path / "b.gguf", **{**kw, "taps": 3})
    assert len(chunks) >= 2 and sorted(cache.glob("*/data-*/*.npz")) == chunks
    assert [c.stat().st_mtime_ns for c in chunks] == stamps
    dirs = sorted(cache.glob("*/data-*/features-*"))
    names = [sorted(f.name for f in d.iterdir()) for d in dirs]
    assert len(dirs) == 2 and names[0] == names[1] == sorted(c.stem + ".npy" for c in chunks)
    assert len(r.shape.target_layers) == 3


def _run_of(cache: Path, out: Path) -> Path:
    import hashlib

    key = hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:16]
    return next(cache.glob(f"*/runs/{key}"), cache / "missing")


def test_a_chat_target_writes_its_own_prompts(tmp_path):
    t = gguf_writers.write_target(tmp_path / "chat.gguf", dataclasses.replace(TARGET, chat_template=CHATML))
    out = tmp_path / "d.gguf"
    r = train_drafter(t, out, steps=2, max_prompts=8, cache_dir=tmp_path / "cache", **FAST)
    assert out.is_file() and r.n_sequences > 0 and r.lossless


# -- bad input: refused up front, nothing written -----------------------------------------------


def _refused(tmp_path: Path, target: Path, exc: type[Exception], match: str, **kw: object) -> None:
    out = kw.pop("out", tmp_path / "out.gguf")
    assert isinstance(out, Path)
    was_dir = out.is_dir()
    with pytest.raises(exc, match=match):
        train_drafter(target, out, steps=1, cache_dir=tmp_path / "cache", **{**FAST, **kw})  # type: ignore[arg-type]
    assert out.is_dir() if was_dir else not out.exists()
    if out.parent.is_dir():
        _no_partial_files(out.parent)


def test_an_architecture_without_layer_inputs_is_refused(tmp_path):
    t = gguf_writers.write_target(tmp_path / "xverse.gguf", TARGET, architecture="xverse")
    _refused(tmp_path, t, DraftCompatibilityError, "does not expose layer inputs")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"messages": [{"role": "user", "content": "hi"}]}\n{"prompt": 3}\n', r"prompts\.jsonl:2: a line needs"),
        ('{"prompt": "a"}\n{"prompt": "b",\n', r"prompts\.jsonl:2: not JSON"),
        ('{"messages": [{"role": "wizard", "content": "x"}]}\n', r"prompts\.jsonl:1: each message needs a 'role'"),
        ("\n\n", r"holds no prompt"),
    ],
)
def test_a_prompts_file_that_does_not_parse_names_its_line(tmp_path, target, text, match):
    p = tmp_path / "prompts.jsonl"
    p.write_text(text)
    _refused(tmp_path, target, PromptsFileError, match, prompts=p)


def test_every_prompts_format_is_read(tmp_path, target):
    from pydflash.train.prompts import read_prompts

    (tmp_path / "a.txt").write_text("first prompt\n\nsecond one\n")
    (tmp_path / "b.jsonl").write_text(
        '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},'
        ' {"role": "assistant", "content": "dropped"}]}\n{"prompt": "raw text"}\n'
    )
    plain = read_prompts(tmp_path / "a.txt", chat=True)
    assert [p.messages for p in plain] == [({"role": "user", "content": "first prompt"},),
                                           ({"role": "user", "content": "second one"},)]  # fmt: skip
    assert [p.text for p in read_prompts(tmp_path / "a.txt", chat=False)] == ["first prompt", "second one"]
    chat, raw = read_prompts(tmp_path / "b.jsonl", chat=True)
    assert chat.messages is not None and [m["role"] for m in chat.messages] == ["system", "user"]
    assert raw.text == "raw text"


def test_a_template_that_does_not_render_is_refused(tmp_path):
    bad = dataclasses.replace(TARGET, chat_template="{{ raise_exception('this template refuses every chat') }}")
    t = gguf_writers.write_target(tmp_path / "bad-template.gguf", bad)
    _refused(tmp_path, t, ChatTemplateError, "refuses every chat")


def test_an_init_drafter_that_does_not_fit_is_refused(tmp_path, target):
    wide = gguf_writers.write_drafter(tmp_path / "wide.gguf", TARGET, gguf_writers.DrafterSpec(n_embd=96))
    _refused(tmp_path, target, DraftCompatibilityError, "hidden size 96 differs from the target's 64", init=wide)
    b16 = gguf_writers.write_drafter(tmp_path / "b16.gguf", TARGET, gguf_writers.DrafterSpec(block_size=16))
    _refused(tmp_path, target, DraftCompatibilityError, "block size 16 differs from the requested 8", init=b16)
    nomask = gguf_writers.write_drafter(tmp_path / "nomask.gguf", TARGET, gguf_writers.DrafterSpec(mask_token=False))
    _refused(tmp_path, target, DraftCompatibilityError, "no mask token", init=nomask)


@pytest.mark.skipif(os.environ.get("CUDA_VISIBLE_DEVICES") not in (None, ""), reason="a CUDA machine")
def test_cuda_on_a_build_without_it_is_refused(tmp_path, target):
    if torch.cuda.is_available():
        pytest.skip("torch sees a CUDA device here")
    _refused(tmp_path, target, TrainingInputError, "--device cuda", device="cuda")


def test_an_output_that_cannot_be_written_is_refused(tmp_path, target):
    _refused(tmp_path, target, TrainingInputError, "does not exist", out=tmp_path / "no" / "such" / "d.gguf")
    _refused(tmp_path, target, TrainingInputError, "is a folder", out=tmp_path)
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        _refused(tmp_path, target, TrainingInputError, "cannot be written", out=ro / "d.gguf")


def test_layer_id_k_is_the_input_of_layer_k(target):
    """Upstream's convention: id 0 is the input of layer 0, i.e. the token embeddings themselves."""
    import gguf

    emb = next(t for t in gguf.GGUFReader(str(target)).tensors if t.name == "token_embd.weight")
    table = np.asarray(emb.data, dtype=np.float32).reshape(TARGET.n_vocab, TARGET.n_embd)
    with Llama(target, n_ctx=256, n_threads=1) as llm:
        cap = _core.FeatureCapture(llm.core_model, [0, 2], 64, 5, 1)  # 5-token passes: chunking is invisible
        toks = llm.tokenize("the cat sat on the mat and the dog")
        feats, top, logits = cap.capture(toks, 4)
        assert feats.shape == (len(toks), 2 * TARGET.n_embd)
        np.testing.assert_allclose(feats[:, : TARGET.n_embd], table[toks], rtol=1e-5, atol=1e-6)
        # the best of the top 4 is the target's own greedy next token, and they come best first
        greedy = llm.generate(toks, max_tokens=1).tokens[0]
        assert int(top[-1, 0]) == greedy and top.shape == logits.shape == (len(toks), 4)
        assert (np.diff(logits, axis=1) <= 0).all()
        np.testing.assert_allclose(logits[-1], llm.pair.score(toks)[-1][top[-1]], rtol=1e-4, atol=1e-4)
        with pytest.raises(ValueError, match="out of range"):
            _core.FeatureCapture(llm.core_model, [TARGET.n_layer], 64, 8, 1)


def test_generated_replies_and_features_are_the_targets_own(tmp_path):
    """FeatureCapture.generate (the trainer's data: replies and features in one pass over each
    token) gives the greedy replies the engine gives and the features capture() gives for them,
    with more prompts than sequences (slots refilled), prompts of several lengths, replies that
    end at the end-of-generation token and replies cut at max_new."""
    path = gguf_writers.write_target(tmp_path / "eos.gguf", dataclasses.replace(TARGET, eos_hot=True, seed=5))
    words = "the of and to in is it you that he was for on are with as his they be at one have".split()  # noqa: SIM905
    rng = np.random.default_rng(1)
    with Llama(path, n_ctx=4 * 96, n_parallel=4, n_threads=1) as llm:
        prompts = [llm.tokenize(" ".join(rng.choice(words, int(rng.integers(1, 12))))) for _ in range(11)]
        want = llm.generate_batch(prompts, max_tokens=40, temperature=0.0)
        cap = _core.FeatureCapture(llm.core_model, [1, 3], 96, 7, 1, 3)  # 7-row passes: prompts split
        got = cap.generate(prompts, 40)
        lengths = [len(r.tokens) for r in want]
        assert min(lengths) < 40 and max(lengths) == 40  # both endings are exercised
        assert [reply.tolist() for reply, _ in got] == [list(r.tokens) for r in want]
        for p, (reply, feats) in zip(prompts, got, strict=True):
            ref, _, _ = cap.capture(p + reply.tolist(), 0)
            assert feats.dtype == np.float16 and feats.shape == ref.shape
            # the same rows within F16 and the float noise of other batch shapes
            assert np.abs(feats.astype(np.float32) - ref).max() <= 2e-3 * np.abs(ref).max()
        with pytest.raises(ValueError, match="empty"):
            cap.generate([prompts[0], []], 8)
        with pytest.raises(pydflash_errors.ContextLimitError, match="do not fit"):
            cap.generate([prompts[0] * 40], 8)
        with pytest.raises(ValueError, match="max_new"):
            cap.generate([prompts[0]], 0)
        assert [r.tolist() for r, _ in cap.generate(prompts[:2], 40)] == [list(r.tokens) for r in want[:2]]
        with pytest.raises(ValueError, match="n_seq"):
            _core.FeatureCapture(llm.core_model, [1], 64, 8, 1, 0)


def test_a_small_target_writes_16_replies_at_once_a_large_one_8(target):
    from pydflash.train.data import default_parallel
    from pydflash.train.target import read_target

    info = read_target(target)
    assert default_parallel(info) == 16
    assert default_parallel(dataclasses.replace(info, n_params=7_000_000_000)) == 8


def test_the_core_install_does_not_need_torch():
    import tomllib

    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert not [d for d in meta["project"]["dependencies"] if d.lower().startswith("torch")]
    code = "import sys, pydflash, pydflash.train, pydflash.cli.main; print('torch' in sys.modules)"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert got == "False"


def test_the_report_is_json(tmp_path, target, prompts):
    r = train_drafter(target, tmp_path / "d.gguf", prompts=prompts, steps=1, cache_dir=tmp_path / "c", **FAST)
    d = json.loads(json.dumps(r.to_json()))
    assert d["steps"] == 1 and d["shape"]["block_size"] == 8 and len(d["curve"]) == 2


# -- llama.cpp's own programs load and draft with the written file --------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, target: Path, prompts: Path) -> Path:
    d = tmp_path_factory.mktemp("trained")
    train_drafter(target, d / "drafter.gguf", prompts=prompts, steps=20, cache_dir=d / "cache", **FAST)
    return d / "drafter.gguf"


def test_llama_speculative_simple_loads_and_drafts_with_it(target, trained):
    from support.native_loop import native_steps

    steps = native_steps(target, "the of and to in is", 32, "draft-dflash", draft=trained, n_ctx=512)
    assert sum(drafted for _, drafted in steps) > 0


def test_llama_server_loads_and_drafts_with_it(target, trained):
    import socket
    import urllib.request

    from support.native_loop import native_binary

    exe = native_binary("llama-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(exe), "-m", str(target), "-md", str(trained), "--spec-type", "draft-dflash", "--spec-draft-n-max", "7",
           "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-c", "512", "-t", "1", "-ngl", "0", "-ngld", "0",
           "--host", "127.0.0.1", "--port", str(port), "--no-webui"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):  # until it answers (it loads both files first), at most a minute
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        body = json.dumps({"prompt": "the of and to in is", "n_predict": 32, "temperature": 0, "ignore_eos": True})
        req = urllib.request.Request(url + "/completion", body.encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            timings = json.loads(r.read())["timings"]
        assert timings["draft_n"] > 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
