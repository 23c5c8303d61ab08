"""The training objective's invariants, the ones whose bugs train "fine" and draft
nothing: a block never sees the features of its anchor's position or later (even
when anchors are closer than a block), slot k's label is the token k after the
anchor, padding changes nothing, the torch drafter computes what llama.cpp's
dflash graph does, and a resumed batch is the same batch."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the train extra (torch) is not installed")

from pydflash import Llama, gguf_writers  # noqa: E402
from pydflash.train.data import Chunk, Dataset  # noqa: E402
from pydflash.train.model import Drafter  # noqa: E402
from pydflash.train.objective import Batch, _blocks, block_loss, draw_batch, slot_weights  # noqa: E402
from pydflash.train.shape import DrafterShape  # noqa: E402

E, TAPS, V, B = 32, 2, 64, 4
SHAPE = DrafterShape(n_layer=1, n_embd=E, n_head=4, n_head_kv=2, head_dim=8, n_ff=48, rope_theta=10000.0,
                     rms_eps=1e-6, n_ctx=256, block_size=B, target_layers=(1, 2), mask_token=V - 1)  # fmt: skip


def _model(seed: int = 0) -> Drafter:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    embd = rng.standard_normal((V, E)).astype(np.float32)
    m = Drafter(SHAPE, embd, rng.standard_normal((V, E)).astype(np.float32))
    with torch.no_grad():
        m.norm.weight.fill_(1.0)
    return m.eval()


def _batch(anchors: list[int], s: int = 24, seed: int = 1) -> Batch:
    rng = np.random.default_rng(seed)
    tokens = torch.from_numpy(rng.integers(0, V - 1, (1, s)))
    feats = torch.from_numpy(rng.standard_normal((1, s, TAPS * E)).astype(np.float32))
    a = torch.tensor([anchors])
    return Batch(tokens, feats, a, torch.ones_like(a, dtype=torch.bool), s)


def _hidden(m: Drafter, b: Batch) -> torch.Tensor:
    inputs, pos, _, mask = _blocks(b, B, SHAPE.mask_token)
    with torch.no_grad():
        return m(b.feats, inputs, pos, mask)


def test_a_block_never_sees_its_anchor_position_or_later():
    m = _model()
    b = _batch([6, 8, 9])  # anchors closer than a block: the bug that "trains fine"
    h = _hidden(m, b)
    for j, a in enumerate([6, 8, 9]):
        later = _batch([6, 8, 9])
        later.feats[:, a:] += 100.0  # every feature at or after this anchor changes
        later.tokens[:, a + B :] = 0  # and every token past this block
        h2 = _hidden(m, later)
        np.testing.assert_allclose(h2[0, j * B : (j + 1) * B], h[0, j * B : (j + 1) * B], rtol=1e-5, atol=1e-5)
    earlier = _batch([6, 8, 9])
    earlier.feats[:, 5] += 1.0  # a feature before every anchor reaches every block
    assert not torch.allclose(_hidden(m, earlier), h)


def test_slot_k_is_labelled_with_the_token_k_after_the_anchor():
    b = _batch([3, 10])
    inputs, pos, labels, _ = _blocks(b, B, SHAPE.mask_token)
    for j, a in enumerate([3, 10]):
        assert pos[0, j * B : (j + 1) * B].tolist() == list(range(a, a + B))
        assert labels[0, j * B : (j + 1) * B].tolist() == b.tokens[0, a : a + B].tolist()
        assert inputs[0, j * B] == b.tokens[0, a] and (inputs[0, j * B + 1 : (j + 1) * B] == SHAPE.mask_token).all()


def test_padding_changes_nothing():
    m = _model()
    w = slot_weights(B)
    short = _batch([4, 9], s=16)
    padded = Batch(
        torch.nn.functional.pad(short.tokens, (0, 8)), torch.nn.functional.pad(short.feats, (0, 0, 0, 8)),
        torch.tensor([[4, 9, 0]]), torch.tensor([[True, True, False]]), 16,
    )  # fmt: skip
    loss_a, acc_a = block_loss(m, short, w, SHAPE.mask_token)
    loss_b, acc_b = block_loss(m, padded, w, SHAPE.mask_token)
    assert torch.isfinite(loss_b) and abs(loss_a.item() - loss_b.item()) < 1e-5
    assert acc_a.tolist() == acc_b.tolist()


def test_the_torch_drafter_computes_what_llama_cpp_drafts(tmp_path):
    """A drafter written from torch weights proposes, in pydflash, the block torch computes for
    the target's captured features (where torch's top-2 margin is clear of rounding)."""
    from pydflash import _core
    from pydflash.train.export import write_drafter_gguf
    from pydflash.train.target import frozen_tensors, read_target

    t = gguf_writers.write_target(tmp_path / "t.gguf", gguf_writers.TargetSpec(hot_tokens=24, head_scale=4.0, seed=2))
    info = read_target(t)
    shape = DrafterShape(n_layer=2, n_embd=info.n_embd, n_head=4, n_head_kv=2, head_dim=16, n_ff=96,
                         rope_theta=info.rope_theta, rms_eps=info.rms_eps, n_ctx=512, block_size=8,
                         target_layers=(1, 3), mask_token=info.mask_token())  # fmt: skip
    embd, head = frozen_tensors(t)
    torch.manual_seed(3)
    m = Drafter(shape, embd, head)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # a drafter with opinions, not near-uniform logits
        m.feat_scale.uniform_(0.1, 10.0)  # the GGUF's fc folds it in
    d = write_drafter_gguf(tmp_path / "d.gguf", shape, info, m.gguf_tensors(), name="t")
    checked = 0
    with Llama(t, n_ctx=512, n_threads=1) as base, Llama(t, draft=d, n_ctx=512, n_threads=1) as spec:
        cap = _core.FeatureCapture(base.core_model, [1, 3], 256, 64, 1)
        for text in ("the quick brown fox jumps", "hello world and more words here"):
            ctx = base.tokenize(text)
            feats, _, _ = cap.capture(ctx[:-1])
            n = len(ctx) - 1
            tokens = torch.tensor([[ctx[n]] + [shape.mask_token] * 7])
            pos = torch.arange(n, n + 8).unsqueeze(0)
            mask = torch.ones(1, 1, 8, n + 8, dtype=torch.bool)
            with torch.no_grad():
                lg = m.logits(m(torch.from_numpy(feats).unsqueeze(0), tokens, pos, mask)[0, 1:])
            top2 = torch.topk(lg, 2, -1)
            spec.pair.prefill(ctx)
            got = list(spec.pair.step(draft_max=7).drafted)
            for slot in range(7):
                if top2.values[slot, 0] - top2.values[slot, 1] > 0.05:
                    assert got[slot] == int(top2.indices[slot, 0]), f"slot {slot}"
                    checked += 1
    assert checked >= 7


def test_a_batch_is_a_function_of_the_step(tmp_path):
    ds = Dataset(tmp_path, (1,))
    rng = np.random.default_rng(0)
    seqs = [([1, 2, 3, 4], list(rng.integers(0, 50, 30))) for _ in range(6)]
    chunk = Chunk.of(seqs)
    ds.add(chunk, rng.standard_normal((len(chunk.tokens), 8)).astype(np.float16))
    a = draw_batch(ds, ds.items(), 5, 17, n_seqs=3, n_anchors=4, block=4)
    b = draw_batch(ds, ds.items(), 5, 17, n_seqs=3, n_anchors=4, block=4)
    c = draw_batch(ds, ds.items(), 5, 18, n_seqs=3, n_anchors=4, block=4)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.anchors, b.anchors) and torch.equal(a.feats, b.feats)
    assert not torch.equal(a.anchors, c.anchors)
    assert (a.anchors[a.valid] >= 3).all()  # anchors start at the prompt's last token
