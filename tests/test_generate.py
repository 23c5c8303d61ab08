"""generate()/stream(): state reset between calls, streaming equivalence, stop
strings, EOS, context limits, sampling options, closing, threads."""

from __future__ import annotations

import threading

import pytest

from pydflash import ContextLimitError, Llama, PyDFlashError, StreamStep


def test_repeated_generate_is_identical(dflash):
    runs = [dflash.generate("def f(x):", max_tokens=64, ignore_eos=True).tokens for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    # a different prompt in between does not leak state
    dflash.generate("something else entirely", max_tokens=30, ignore_eos=True)
    assert dflash.generate("def f(x):", max_tokens=64, ignore_eos=True).tokens == runs[0]


def test_stream_equals_generate(dflash):
    dm = dflash.pair.max_draft  # accepted counts are compared: fixed draft lengths
    res = dflash.generate("import sys", max_tokens=70, ignore_eos=True, draft_max=dm)
    steps = list(dflash.stream("import sys", max_tokens=70, ignore_eos=True, draft_max=dm))
    assert all(isinstance(s, StreamStep) for s in steps)
    assert sum((s.tokens for s in steps), []) == res.tokens
    assert "".join(s.text for s in steps) == res.text
    assert steps[-1].finish_reason == "length"
    assert all(s.finish_reason is None for s in steps[:-1])
    assert [s.n_accepted for s in steps] == [s.n_accepted for s in res.stats.steps]


def test_generate_sleeps_until_the_end(dflash, monkeypatch):
    # generate() reads only the result: the engine wakes its caller once, at the end, not
    # for every step (a caller woken per step took the GIL and a core from the engine's
    # thread while the next step computed)
    from pydflash.engine import channel as _channel
    from pydflash.engine import generation as _generation

    notified: list[int] = []

    class Counting(threading.Condition):
        def notify(self, n: int = 1) -> None:
            notified.append(n)
            super().notify(n)

    init = _channel.Channel.__init__

    def counted(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self._cv = Counting()

    monkeypatch.setattr(_channel.Channel, "__init__", counted)
    # ... and is handed one event, at the end, with every token and the whole text (building
    # and queueing one per step took ~15 us of the engine's thread)
    events: list[int] = []
    event = _generation.Generation._event

    def counted_event(self, step):
        events.append(1)
        return event(self, step)

    monkeypatch.setattr(_generation.Generation, "_event", counted_event)
    res = dflash.generate("import os", max_tokens=40, ignore_eos=True, draft_max=0)
    assert res.stats.n_steps == 40 and len(res.tokens) == 40
    assert notified == [1] and events == [1]
    # a whole completion's text is that one event's, cut at a stop string as a stream's
    stop = res.text[12:15]
    events.clear()
    whole = dflash.create_completion("import os", max_tokens=40, temperature=0.0, ignore_eos=True, draft_max=0,
                                     stop=[stop])
    assert events == [1]
    streamed = list(dflash.stream("import os", max_tokens=40, ignore_eos=True, draft_max=0, stop=[stop]))
    assert whole["choices"][0]["text"] == "".join(s.text for s in streamed) == res.text[: res.text.find(stop)]
    assert whole["choices"][0]["finish_reason"] == streamed[-1].finish_reason == "stop"
    # so do a whole completion's, which asks its cancel check now and then meanwhile
    notified.clear()
    out = dflash.create_completion("import os", max_tokens=40, temperature=0.0, ignore_eos=True, draft_max=0,
                                   cancel=lambda: False)
    assert out["choices"][0]["text"] == res.text and notified == [1]
    # a stream's reader is woken for each run of its plain steps (here the shortest: two steps)
    from pydflash.engine import engine as _engine

    monkeypatch.setattr(_engine, "STREAM_RUN_MS", 1e-3)
    notified.clear()
    events.clear()
    steps = list(dflash.stream("import os", max_tokens=40, ignore_eos=True, draft_max=0))
    assert len(steps[0].tokens) == 1  # the first token alone (a time to first token), then runs
    assert len(steps) == 21 and len(notified) == 21 and len(events) == 21
    assert sum((s.tokens for s in steps), []) == res.tokens


def test_a_quiet_readers_stop_strings_are_searched_in_new_text_only(dflash, monkeypatch):
    # a reader that waits for the end gets one event, but the text is still released step
    # by step where stop strings are searched: each search covers the text not released
    # yet, not everything so far (a 32K-token reply would search ~32K times its whole text)
    from pydflash.engine import text as _text

    searched: list[int] = []
    find = _text.TextAssembler.find_stop

    def counted(self, final=False):
        searched.append(len(self._buf) - self._sent)
        return find(self, final)

    monkeypatch.setattr(_text.TextAssembler, "find_stop", counted)
    res = dflash.generate("import os", max_tokens=300, ignore_eos=True, draft_max=0, stop=["\x00never"])
    assert len(res.tokens) == 300 and len(searched) == 300
    assert max(searched) < 100 < len(res.text.encode())
    whole = dflash.stream("import os", max_tokens=300, ignore_eos=True, draft_max=0, stop=["\x00never"])
    assert "".join(s.text for s in whole) == res.text


def test_text_matches_detokenize(dflash):
    res = dflash.generate("The quick", max_tokens=50, ignore_eos=True)
    assert res.text == dflash.detokenize(res.tokens).decode("utf-8", errors="replace")


def test_tokenize_roundtrip(dflash):
    for text in ["def main():\n    return 0\n", "hello world", "ünïcödé ✓", ""]:
        assert dflash.detokenize(dflash.tokenize(text.encode())) == text.encode()
    with pytest.raises(TypeError):
        dflash.tokenize(123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="out of range"):
        dflash.detokenize([1, 99999])


def test_stop_strings(dflash, baseline):
    full = baseline.generate("for i in", max_tokens=80, ignore_eos=True)
    stop = full.text[20:23]
    first = full.text.find(stop)
    res = dflash.generate("for i in", max_tokens=80, ignore_eos=True, stop=[stop, "never-appears"])
    assert res.finish_reason == "stop"
    assert res.text == full.text[:first]
    assert stop not in res.text
    assert res.tokens == full.tokens[: len(res.tokens)]
    streamed = list(dflash.stream("for i in", max_tokens=80, ignore_eos=True, stop=stop))
    assert "".join(s.text for s in streamed) == res.text
    assert sum((s.tokens for s in streamed), []) == res.tokens
    assert streamed[-1].finish_reason == "stop"


def test_eos_ends_generation(model_dir):
    t, d = model_dir / "target-eos.gguf", model_dir / "drafter-eos.gguf"
    with Llama(t, n_ctx=1024) as base, Llama(t, draft=d, n_ctx=1024) as spec:
        eos_id = base.tokenize("<|endoftext|>", add_bos=False, special=True)
        assert len(eos_id) == 1
        hits = 0
        for prompt in ["a", "def", "import os", "x = 1", "class A:", "hello", "1 + 2", "return"]:
            full = base.generate(prompt, max_tokens=128, ignore_eos=True).tokens
            if eos_id[0] not in full:
                continue
            hits += 1
            cut = full.index(eos_id[0])
            for llm in (base, spec):
                res = llm.generate(prompt, max_tokens=128)
                assert res.finish_reason == "eos"
                assert res.tokens == full[:cut]
                out = llm.create_completion(prompt, max_tokens=128, temperature=0.0)
                assert out["choices"][0]["finish_reason"] == "stop"
                assert out["usage"]["completion_tokens"] == cut  # the EOS ends it and is not counted
        assert hits > 0, "no prompt reached EOS: pick others"


def test_prompt_longer_than_context(target_path, model_dir):
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=64) as llm:
        with pytest.raises(ContextLimitError, match="prompt has 100 tokens"):
            llm.generate(list(range(1, 101)), max_tokens=5)
        with pytest.raises(ValueError):  # ContextLimitError is a ValueError too
            llm.generate(list(range(1, 65)), max_tokens=5)
        # still usable afterwards
        assert len(llm.generate("ok", max_tokens=5, ignore_eos=True).tokens) == 5


def test_generation_running_past_context(target_path, model_dir):
    with Llama(target_path, n_ctx=64) as base, \
            Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=64) as spec:
        prompt = list(range(1, 41))
        want = base.generate(prompt, max_tokens=500, ignore_eos=True)
        got = spec.generate(prompt, max_tokens=500, ignore_eos=True)
        assert want.finish_reason == got.finish_reason == "length"
        assert len(want.tokens) == 64 - 40 + 1  # fills the context, plus the last sampled token
        assert got.tokens == want.tokens
        # the longest prompt that fits still generates
        assert len(spec.generate(list(range(1, 64)), max_tokens=10, ignore_eos=True).tokens) >= 1


def test_empty_and_bad_prompts(dflash):
    with pytest.raises(ValueError, match="empty"):
        dflash.generate([], max_tokens=3)
    with pytest.raises(TypeError):
        dflash.generate([1, "a"], max_tokens=3)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="out of range"):
        dflash.generate([1, 10**7], max_tokens=3)
    # an empty text prompt starts from the vocabulary's BOS token
    assert len(dflash.generate("", max_tokens=3, ignore_eos=True).tokens) == 3
    assert dflash.generate("fine", max_tokens=0).tokens == []


@pytest.mark.parametrize("kwargs,match", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"draft_max": -1}, "draft_max"),
])
def test_bad_sampling_arguments(dflash, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dflash.generate("x", **kwargs)
    assert len(dflash.generate("x", max_tokens=3, ignore_eos=True).tokens) == 3


def test_draft_max_above_the_block_is_refused(dflash):
    block = dflash.pair.block_size
    for call in (dflash.generate, dflash.stream):
        with pytest.raises(ValueError, match=f"draft_max={block} exceeds this drafter's block size {block}"):
            call("x", max_tokens=5, draft_max=block)
    assert len(dflash.generate("x", max_tokens=5, ignore_eos=True, draft_max=block - 1).tokens) == 5


def test_bad_argument_types(dflash):
    with pytest.raises(TypeError, match="max_tokens"):
        dflash.generate("x", max_tokens=3.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stop"):
        dflash.generate("x", stop=[1])  # type: ignore[list-item]


def test_temperature_sampling_is_seeded(dflash, baseline):
    a = dflash.generate("def", max_tokens=60, temperature=0.8, seed=42, ignore_eos=True)
    b = dflash.generate("def", max_tokens=60, temperature=0.8, seed=42, ignore_eos=True)
    c = dflash.generate("def", max_tokens=60, temperature=5.0, seed=43, ignore_eos=True)
    assert a.tokens == b.tokens
    assert c.tokens != a.tokens
    # top_k=1 is greedy at any temperature
    g = baseline.generate("def", max_tokens=30, ignore_eos=True)
    k1 = dflash.generate("def", max_tokens=30, temperature=1.0, top_k=1, ignore_eos=True)
    assert k1.tokens == g.tokens


def test_close_and_context_manager(target_path, model_dir):
    llm = Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=128)
    pair = llm.pair
    with llm:
        assert not llm.closed
    assert llm.closed
    llm.close()  # idempotent
    with pytest.raises(PyDFlashError, match="closed"):
        llm.generate("x")
    with pytest.raises(PyDFlashError, match="closed"):
        pair.prefill([1, 2])
    assert "closed" in repr(llm)


def test_threads_share_one_object(dflash_b8):
    want = dflash_b8.generate("thread", max_tokens=40, ignore_eos=True).tokens
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                results.append(dflash_b8.generate("thread", max_tokens=40, ignore_eos=True).tokens)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert len(results) == 9 and all(r == want for r in results)


def test_nested_generation_on_one_thread_waits_its_turn(dflash_b8):
    # one slot: the open stream's generation runs on (its steps queue up unread), then
    # the nested one gets the slot; neither changes the other's output
    want_a = dflash_b8.generate("a", max_tokens=20, ignore_eos=True).tokens
    want_b = dflash_b8.generate("b", max_tokens=3, ignore_eos=True).tokens
    it = dflash_b8.stream("a", max_tokens=20, ignore_eos=True)
    first = next(it)
    assert dflash_b8.generate("b", max_tokens=3, ignore_eos=True).tokens == want_b
    steps = [first, *it]  # (the first may hold them all: a run of plain steps)
    assert steps[-1].finish_reason == "length"
    assert sum((s.tokens for s in steps), []) == want_a


def test_memory_report(dflash, baseline, model_dir):
    rep = dflash.memory()
    roles = {r.role for r in rep.rows}
    assert roles == {"target", "drafter"}
    assert all(r.buffer and min(r.model, r.context, r.compute) >= 0 for r in rep.rows)
    # the target's weights are at least its tensor bytes; the file holds them plus a header
    target_file = (model_dir / "target.gguf").stat().st_size
    assert 0.5 * target_file < sum(r.model for r in rep.rows if r.role == "target") <= target_file
    assert rep.target_bytes > 0 and rep.drafter_bytes > 0
    assert rep.total() == rep.target_bytes + rep.drafter_bytes
    assert sum(r.context for r in rep.rows if r.role == "target") > 0  # the KV cache
    assert "target" in str(rep) and "drafter" in str(rep)
    alone = baseline.memory()
    assert {r.role for r in alone.rows} == {"target"} and alone.drafter_bytes == 0


class _CountingCore:
    """The engine's core, counting its step calls (runs: their lengths)."""

    def __init__(self, core):
        self._c = core
        self.runs: list[int] = []
        self.widths: list[int] = []  # the sequences of each run
        self.steps = 0

    def __getattr__(self, name):
        return getattr(self._c, name)

    def step_runs(self, steps, *args):
        out = self._c.step_runs(steps, *args)
        self.runs.append(max(len(r) for r in out))
        self.widths.append(len(steps))
        return out

    def step_batch(self, steps):
        self.steps += 1
        return self._c.step_batch(steps)


def test_a_lone_generation_that_drafts_nothing_steps_in_runs(baseline, dflash_b8, monkeypatch):
    # where one sequence drafts nothing, the engine hands its steps to the core in runs,
    # one call for many (its own work per step cost the embedded target ~10% of its step);
    # a stream gets each run's tokens at once: the same tokens as those taken one by one
    from pydflash.engine import engine as _engine

    counting = _CountingCore(baseline._engine._core)
    monkeypatch.setattr(baseline._engine, "_core", counting)
    monkeypatch.setattr(_engine, "RUN_MS", 1e9)  # runs as long as allowed, whatever the machine's speed
    res = baseline.generate("import os", max_tokens=300, ignore_eos=True)
    # (the first token comes alone: runs wait for it, so as not to hold up a time to first token)
    assert counting.runs == [_engine.RUN_MAX_STEPS, 299 - _engine.RUN_MAX_STEPS] and counting.steps == 1
    counting.runs.clear()
    monkeypatch.setattr(_engine, "STREAM_RUN_MS", 1e-3)  # the shortest runs: two steps
    counting.steps = 0
    streamed = list(baseline.stream("import os", max_tokens=300, ignore_eos=True))
    assert counting.runs == [2] * 149 + [1] and counting.steps == 1
    assert len(streamed) <= 151  # an event per run (a token whose text is incomplete waits for the next)
    assert sum((s.tokens for s in streamed), []) == res.tokens
    # a stop string is searched after every step: no runs
    counting.runs.clear()
    stopped = baseline.generate("import os", max_tokens=300, ignore_eos=True, stop=[res.text[-20:-15]])
    assert counting.runs == [] and stopped.finish_reason == "stop"
    # an adaptive pair whose drafting does not pay (random drafter weights) goes off and
    # runs its plain steps; every output is the target's
    from pydflash.draft_length import DraftPolicy

    pair_core = _CountingCore(dflash_b8._engine._core)
    monkeypatch.setattr(dflash_b8._engine, "_core", pair_core)
    observed: list[int] = []  # the policy sees every step once (a run's as one), a generation's last too
    observe = DraftPolicy.observe
    monkeypatch.setattr(
        DraftPolicy, "observe", lambda p, *a: (observed.append(a[-1] if len(a) > 5 else 1), observe(p, *a))[1]
    )
    for prompt in ["import os", "def f(x):", "hello"]:
        want = baseline.generate(prompt, max_tokens=400, ignore_eos=True).tokens
        assert dflash_b8.generate(prompt, max_tokens=400, ignore_eos=True).tokens == want
    # (single steps, its weighings and probes, may be none here: a pair whose probes found
    # that even a whole block kept saves nothing probes every 4,096 steps, and a settled
    # sequence is not weighed)
    assert sum(pair_core.runs) > 400
    assert sum(observed) == sum(pair_core.runs) + pair_core.steps


def test_sequences_that_draft_nothing_step_together_in_runs(target_path, monkeypatch):
    # four streams of the target alone: their steps go to the core in runs of all four (a
    # sequence that ends drops out, the others go on), and each gets the tokens it gets alone
    from pydflash import Llama
    from pydflash.engine import engine as _engine

    prompts = ["import os", "def f(x):", "hello", "class A:"]
    lengths = [40, 90, 60, 120]
    with Llama(target_path, n_ctx=1024) as alone:
        want = [alone.generate(p, max_tokens=n, ignore_eos=True).tokens for p, n in zip(prompts, lengths)]
    monkeypatch.setattr(_engine, "STREAM_RUN_MS", 1e9)
    with Llama(target_path, n_ctx=4096, n_parallel=4) as llm:
        counting = _CountingCore(llm._engine._core)
        monkeypatch.setattr(llm._engine, "_core", counting)
        with llm._engine._cv:  # all four wait before the engine admits any (they start together)
            subs = [llm.submit(p, max_tokens=n, ignore_eos=True) for p, n in zip(prompts, lengths)]
        got = [[t for step in sub for t in step.tokens] for sub in subs]
    assert got == want
    assert 4 in counting.widths and sum(counting.runs) + counting.steps <= max(lengths) + 8


def test_a_pinned_plain_generation_on_an_adaptive_pair_steps_in_runs(baseline, dflash_b8, monkeypatch):
    # draft_max=0 for one call on a pair whose Llama adapts: nothing to weigh, so its steps
    # go in runs as the target alone's do (one at a time, the engine's own work per step
    # made it ~12% slower than the target alone on the embedded pair)
    from pydflash.engine import engine as _engine

    pair_core = _CountingCore(dflash_b8._engine._core)
    monkeypatch.setattr(dflash_b8._engine, "_core", pair_core)
    monkeypatch.setattr(_engine, "RUN_MS", 1e9)
    want = baseline.generate("import os", max_tokens=300, ignore_eos=True).tokens
    got = dflash_b8.generate("import os", max_tokens=300, ignore_eos=True, draft_max=0)
    assert got.tokens == want and got.stats.n_drafted == 0
    assert pair_core.runs == [_engine.RUN_MAX_STEPS, 299 - _engine.RUN_MAX_STEPS] and pair_core.steps == 1
