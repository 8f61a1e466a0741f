"""Draft verification: a guessed output is checked in batched passes; the ids never change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dictation.asr.decode.greedy as generate_mod
from dictation.asr.decode.greedy import greedy
from dictation.asr.nn.kv_cache import StaticKVCache
from tests.asr.embeds import prompt_embeds
from tests.oracle import synth_audio

SR = 16000
MAX_NEW = 24
CLIPS = [(2.5, 1), (4.0, 2), (6.0, 3)]  # (seconds, seed)


def common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def run(engine, embeds, draft=None, max_new_tokens=MAX_NEW, **kw):
    engine.pipeline.cache_owner = None  # the cache is overwritten
    eos = engine.prompt.special.eos
    return greedy(engine.model, embeds, max_new_tokens=max_new_tokens, eos_ids=eos, draft=draft, **kw)


def drafts(ref: list[int], eos: int, seed: int) -> dict[str, list[int]]:
    """Drafts of every kind for the greedy output ``ref``."""
    rng = np.random.default_rng(seed)
    vocab = 151000

    def garbage(n):
        return [int(t) for t in rng.integers(0, vocab, n)]

    cut = int(rng.integers(1, max(2, len(ref))))
    diverged = ref[:cut] + [(ref[cut] + 1) % vocab if cut < len(ref) else 7] + garbage(40)
    return {
        "exact": list(ref),
        "prefix": ref[: max(1, len(ref) // 2)],
        "diverging": diverged,
        "garbage": garbage(60),
        "longer": ref + garbage(30),
        "eos_early": ref[:2] + [eos] + ref[2:],
        "empty": [],
        "wrong_first": [(ref[0] + 1) % vocab if ref else 5] + ref[1:],
        "out_of_vocab": ref[:3] + [10**9, -1] + ref[3:],
    }


@pytest.fixture(params=["untied", "stops"])
def engine(request, ckpt_untied, ckpt_stops, engine_factory):
    return engine_factory(ckpt_untied if request.param == "untied" else ckpt_stops)


@pytest.mark.parametrize(("seconds", "seed"), CLIPS)
def test_any_draft_gives_the_plain_greedy_ids(engine, seconds, seed, monkeypatch):
    embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
    plain = run(engine, embeds)
    ref = plain.token_ids
    assert ref and plain.draft_accepted == plain.draft_passes == 0
    steps = []
    real_step = engine.model.step
    monkeypatch.setattr(engine.model, "step", lambda *a: steps.append(1) or real_step(*a))
    eos = min(engine.prompt.special.eos)
    for kind, draft in drafts(ref, eos, seed).items():
        steps.clear()
        got = run(engine, embeds, draft=draft)
        assert got.token_ids == ref, kind
        assert got.stopped_on_eos == plain.stopped_on_eos, kind
        assert got.draft_accepted == common_prefix(draft, ref), kind
        if kind == "exact":
            # all of it in one pass: the budget or EOS is reached without a single step
            assert got.draft_accepted == len(ref) and got.draft_passes == 1 and not steps
        if kind in ("empty", "wrong_first"):
            assert got.draft_passes == 0 and len(steps) == len(ref) - 1 + plain.stopped_on_eos


def test_the_untied_model_runs_to_the_budget_and_the_stopping_one_ends_early(ckpt_untied, ckpt_stops, engine_factory):
    # the checks above cover both endings only if these hold
    audio = synth_audio(4.0, seed=2)
    assert not run(engine_factory(ckpt_untied), prompt_embeds(engine_factory(ckpt_untied), audio)).stopped_on_eos
    stops = engine_factory(ckpt_stops)
    assert run(stops, prompt_embeds(stops, audio)).stopped_on_eos


def test_small_verify_chunks_keep_accepting_across_passes(engine, monkeypatch):
    monkeypatch.setattr(generate_mod, "VERIFY_CHUNK", 4)
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=5))
    ref = run(engine, embeds).token_ids
    got = run(engine, embeds, draft=ref)
    assert got.token_ids == ref and got.draft_accepted == len(ref)
    # a pass feeds the newest id and 3 draft ids, and its last row picks the next draft id as well
    assert got.draft_passes == -(-(len(ref) - 1) // 4)
    bad = ref[:5] + [(ref[5] + 1) % 1000] + ref[6:] if len(ref) > 6 else ref[:1] + [3] * 20
    got = run(engine, embeds, draft=bad)
    assert got.token_ids == ref and got.draft_accepted == common_prefix(bad, ref)


def test_budget_and_should_stop_are_respected(ckpt_untied, engine_factory):
    engine = engine_factory(ckpt_untied)
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=6))
    ref = run(engine, embeds, max_new_tokens=40).token_ids
    for budget in (0, 1, 2, 3, 10):
        got = run(engine, embeds, draft=ref, max_new_tokens=budget)
        assert got.token_ids == ref[:budget]
        assert got.draft_accepted == budget
    got = run(engine, embeds, draft=ref, should_stop=lambda: True)
    assert got.token_ids == ref[:1] and got.draft_passes == 0


def test_stale_draft_entries_are_never_attended(ckpt_untied, engine_factory, monkeypatch):
    """Logits after a rejected garbage draft equal those of a cache that never held it (up to the
    rounding of the batched pass), and would not if steps attended to positions after their own."""
    engine = engine_factory(ckpt_untied)
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=7))
    ref = run(engine, embeds).token_ids
    p = embeds.shape[1]
    garbage = [1000 + 37 * i for i in range(50)]

    def steps_after_garbage() -> list[torch.Tensor]:
        with torch.inference_mode():
            model.prefill(embeds, MAX_NEW)
            # ref[0], ref[1] then garbage: positions p+2 .. p+51 now hold the rejected draft
            rows = model.forward_tokens(torch.tensor(ref[:2] + garbage), p)
            assert model.cache.keys[:, :, :, p + 6 : p + 52].abs().sum() > 0
            return [*rows[:2], *(model.step(torch.tensor([t]), p + i) for i, t in enumerate(ref[2:6], start=2))]

    with torch.inference_mode():
        model.prefill(embeds, MAX_NEW)
        clean = [model.step(torch.tensor([t]), p + i) for i, t in enumerate(ref[:6])]
    for got, want in zip(steps_after_garbage(), clean, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
        assert got.argmax() == want.argmax()

    real_write = StaticKVCache.write

    def leaky_write(self, layer, start, k, v):  # a step that also saw the 4 positions after its own
        keys, values = real_write(self, layer, start, k, v)
        if k.shape[2] == 1:
            return self.keys[layer, :, :, : start + 5], self.values[layer, :, :, : start + 5]
        return keys, values

    monkeypatch.setattr(StaticKVCache, "write", leaky_write)
    leaked = steps_after_garbage()
    assert max(float((got - want).abs().max()) for got, want in zip(leaked[2:], clean[2:], strict=True)) > 0.1


def test_forward_tokens_rows_equal_steps(ckpt_untied, engine_factory):
    engine = engine_factory(ckpt_untied)
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(2.5, seed=8))
    ref = run(engine, embeds).token_ids[:8]
    p = embeds.shape[1]
    with torch.inference_mode():
        model.prefill(embeds, MAX_NEW)
        steps = torch.stack([model.step(torch.tensor([t]), p + i) for i, t in enumerate(ref)])
        model.prefill(embeds, MAX_NEW)
        rows = model.forward_tokens(torch.tensor(ref), p)
    torch.testing.assert_close(rows, steps, rtol=1e-4, atol=1e-4)


def test_forward_tokens_grows_the_cache(ckpt_untied, engine_factory):
    engine = engine_factory(ckpt_untied)
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(2.5, seed=8))
    with torch.inference_mode():
        model.prefill(embeds, 1)
        p = embeds.shape[1]
        far = model.cache.max_len - 2
        rows = model.forward_tokens(torch.tensor([5, 6, 7, 8]), far)
    assert rows.shape == (4, model.cfg.text.vocab_size) and model.cache.max_len >= far + 4
    assert p < far


# --- through the engine and the stream ----------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "seed"), [(5.0, 11), (9.0, 12)])
def test_transcribe_with_a_partial_transcript_as_draft(engine, seconds, seed):
    audio = synth_audio(seconds, seed=seed)
    plain = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    partial = engine.transcribe(audio[: int(0.7 * len(audio))], max_new_tokens=MAX_NEW)
    got = engine.transcribe(audio, max_new_tokens=MAX_NEW, draft_ids=partial.token_ids)
    assert got.token_ids == plain.token_ids
    assert (got.text, got.language, got.truncated) == (plain.text, plain.language, plain.truncated)
    assert got.timings["draft_accepted"] == common_prefix(partial.token_ids, plain.token_ids)
    assert got.timings["draft_tokens"] == len(partial.token_ids)
    assert "draft_accepted" not in plain.timings
    exact = engine.transcribe(audio, max_new_tokens=MAX_NEW, draft_ids=plain.token_ids)
    assert exact.token_ids == plain.token_ids and exact.timings["draft_accepted"] == len(plain.token_ids)


def test_stream_partial_then_finish_with_the_draft(engine):
    audio = synth_audio(25.0, seed=13)
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    stream.feed(audio[: 9 * SR])
    assert stream.windows_done == 1
    first = stream.partial()
    assert first  # decoding after the cached prompt wrote past it ...
    stream.feed(audio[9 * SR : 18 * SR])  # ... and the next window overwrites those positions
    assert stream.windows_done == 2
    draft = stream.partial()
    assert draft
    stream.feed(audio[18 * SR :])
    got = stream.finish(draft_ids=draft)
    assert got.token_ids == whole.token_ids and got.text == whole.text
    assert got.timings["draft_accepted"] == common_prefix(draft, whole.token_ids)
    assert got.timings["stream_windows"] == 3


def test_stream_partial_of_a_stream_with_no_window_is_none_and_finish_still_takes_a_draft(engine):
    audio = synth_audio(5.0, seed=14)
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    stream.feed(audio)
    assert stream.partial() is None
    got = stream.finish(draft_ids=whole.token_ids)  # the fallback path: engine.transcribe
    assert got.token_ids == whole.token_ids and got.timings["draft_accepted"] == len(whole.token_ids)


def test_stream_partial_equals_transcribe_of_the_streamed_windows_when_the_floor_holds(engine):
    # the first window is the loudest, so the running floor is the clip's: same features,
    # and the tail frames are the only difference (reflect padding), which a clip cut at the
    # window end does not change for the encoder's window
    audio = synth_audio(17.0, seed=4) * 0.5
    audio[:SR] = synth_audio(1.0, seed=9) * 1.8
    stream = engine.stream(max_new_tokens=MAX_NEW)
    stream.feed(audio[: 9 * SR])
    draft = stream.partial()
    stream.feed(audio[9 * SR :])
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    got = stream.finish(draft_ids=draft)
    assert got.token_ids == whole.token_ids
