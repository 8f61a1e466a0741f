"""The audio encoder padded to buckets of 8-s windows and the prefill padded to buckets of prompt
lengths: what CUDA captures per bucket (encoder.ENCODER_BUCKETS, model.PREFILL_BUCKETS,
graphs.StaticCall), checked here on the CPU, uncaptured, against the unpadded computation: the
encoder bit for bit in fp32; the prefill to float32 rounding (the CPU's causal attention kernel
blocks its work by the sequence length) with the same ids. (Captured on a GPU: test_fast_paths_cuda.py.)"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import dictation.asr.nn.encoder as encoder_mod
import dictation.asr.nn.model as model_mod
from dictation.asr import AsrEngine, EngineOptions
from dictation.asr.nn.features import n_audio_tokens
from dictation.asr.nn.graphs import StaticCall
from dictation.asr.nn.options import ModelOptions
from tests.asr.test_fast_paths import prompt_embeds
from tests.asr.test_variants import write_adapter
from tests.oracle import synth_audio

SECONDS = [1.0, 2.5, 4.3, 8.0, 9.7, 16.0, 19.5]


@pytest.fixture(scope="module")
def engine(ckpt_untied):
    engine = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu", dtype="fp32"))
    engine.prepare()
    return engine


def use(monkeypatch, model, **changes) -> None:
    """Run ``model`` with these options for the test (the shared engine's model gets its own back)."""
    monkeypatch.setattr(model, "options", replace(model.options, **changes))


def padded(features: torch.Tensor, windows: int) -> torch.Tensor:
    return F.pad(features, (0, windows * 800 - features.shape[-1]))


@pytest.mark.parametrize("seconds", SECONDS)
def test_the_bucketed_encoder_gives_the_unpadded_rows_bit_for_bit(engine, seconds):
    encoder = engine.model.audio_tower
    with torch.inference_mode():
        features = engine.pipeline.mel(synth_audio(seconds, seed=3))
        frames = features.shape[-1]
        n = n_audio_tokens(frames)
        want = encoder(features)  # unpadded on the CPU
        assert encoder.bucket(frames, frames) is None and want.shape[0] == n
        needed = -(-frames // 800)
        for windows in (needed, needed + 1, needed + 3):
            got = encoder.forward_bucketed(padded(features, windows), n)
            assert got.shape[0] == windows * 104 and torch.isfinite(got).all()
            assert torch.equal(got[:n], want), windows
            # The same with the number of valid rows as a device tensor, as a captured graph gets it.
            assert torch.equal(encoder.forward_bucketed(padded(features, windows), torch.tensor(n))[:n], want)


def test_a_part_from_a_window_boundary_is_bucketed_like_the_clip(engine, monkeypatch):
    """Streaming encodes a clip's windows and its tail apart (clip_frames)."""
    encoder = engine.model.audio_tower
    with torch.inference_mode():
        features = engine.pipeline.mel(synth_audio(19.5, seed=4))
        total = features.shape[-1]
        want = [encoder(features[:, :800], clip_frames=total), encoder(features[:, 1600:], clip_frames=total)]
        use(monkeypatch, engine.model, encoder_bucketed=True)
        assert encoder.bucket(total - 1600, total) == 1
        got = [encoder(features[:, :800], clip_frames=total), encoder(features[:, 1600:], clip_frames=total)]
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_one_static_call_per_bucket_reused_and_dropped_with_a_move(engine, monkeypatch):
    encoder = engine.model.audio_tower
    use(monkeypatch, engine.model, encoder_bucketed=True)
    encoder.release_graphs()
    made = []
    real = StaticCall.__init__
    monkeypatch.setattr(StaticCall, "__init__", lambda self, *a, **k: made.append(a[1][0].shape) or real(self, *a, **k))
    with torch.inference_mode():
        for seconds in (2.5, 4.3, 9.7, 12.0, 0.5, 40.0):  # buckets 1, 1, 2, 2; under a chunk: unpadded; past them
            features = engine.pipeline.mel(synth_audio(seconds, seed=5))
            out = encoder(features)
            use(monkeypatch, engine.model, encoder_bucketed=False)
            assert torch.equal(out, encoder(features))
            use(monkeypatch, engine.model, encoder_bucketed=True)
    assert made == [(128, 800), (128, 1600)] and sorted(encoder._graphs) == [1, 2]
    calls = list(encoder._graphs.values())
    assert all(isinstance(c, StaticCall) and not c.captured for c in calls)  # no capture on the CPU
    engine.model.float()  # a cast (here to the same dtype) drops them, as a move would
    assert encoder._graphs == {}


def test_bucketing_leaves_the_transcript_as_it_was(engine, monkeypatch):
    audio = synth_audio(9.7, seed=6)
    want = engine.pipeline.run(audio, None, "", 8, keep_first_logits=True)
    use(monkeypatch, engine.model, encoder_bucketed=True)
    got = engine.pipeline.run(audio, None, "", 8, keep_first_logits=True)
    assert got.ids == want.ids and torch.equal(got.first_logits, want.first_logits)


def test_a_tail_window_attends_only_to_itself(engine):
    """The tail window is padded inside the attention only: its rows do not change when the padding's
    values do, and they are the window's own attention (checked against the tail encoded alone)."""
    encoder = engine.model.audio_tower
    mask = encoder_mod.window_key_mask(130, 208, 104, torch.device("cpu"))
    assert mask.shape == (2, 1, 1, 104) and mask[0].all() and mask[1, 0, 0, :26].all() and not mask[1, 0, 0, 26:].any()
    empty = encoder_mod.window_key_mask(torch.tensor(130), 312, 104, torch.device("cpu"))
    assert empty[2].all()  # a window with no row of the clip sees itself (finite, dropped)
    with torch.inference_mode():
        features = engine.pipeline.mel(synth_audio(10.0, seed=7))
        whole = encoder(features)
        tail = encoder(features[:, 800:], clip_frames=features.shape[-1])
    torch.testing.assert_close(whole[104:], tail, rtol=0, atol=1e-5 * float(tail.abs().max()))


# --- the prefill ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "seed"), [(0.62, 11), (2.5, 1), (6.5, 3), (19.5, 13)])
def test_the_bucketed_prefill_gives_the_unpadded_logits_and_cache(engine, monkeypatch, seconds, seed):
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
    total = embeds.shape[1]
    with torch.inference_mode():
        want = model.prefill(embeds, 8)
        keys, values = model.cache.keys[..., :total, :].clone(), model.cache.values[..., :total, :].clone()
        model.cache.keys.fill_(float("nan"))  # nothing of the first run may be read
        use(monkeypatch, model, prefill_bucketed=True)
        bucket = model.prefill_bucket(0, total)
        assert bucket == min(b for b in model_mod.PREFILL_BUCKETS if b >= total) and model.prefill_bucket(5, 9) is None
        got = model.prefill(embeds, 8)
    assert got.shape == want.shape and int(got.argmax()) == int(want.argmax())
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))
    # Layer 0's keys and values come from the rows' projections alone: bit for bit.
    assert torch.equal(model.cache.keys[0, ..., :total, :], keys[0]) and torch.equal(
        model.cache.values[0, ..., :total, :], values[0]
    )
    torch.testing.assert_close(model.cache.keys[..., :total, :], keys, rtol=0, atol=1e-5 * float(keys.abs().max()))
    assert torch.isfinite(model.cache.keys[..., :bucket, :]).all()  # the padding's positions are written too


def test_bucketed_prefills_leave_the_transcripts_as_they_were(engine, monkeypatch):
    audio = [synth_audio(s, seed=r) for s, r in ((2.5, 1), (4.3, 12), (6.5, 3))]
    want = [engine.pipeline.run(a, None, "", 12) for a in audio]
    use(monkeypatch, engine.model, prefill_bucketed=True, encoder_bucketed=True)
    got = [engine.pipeline.run(a, None, "", 12) for a in audio]
    assert [g.ids for g in got] == [w.ids for w in want]


def test_one_prefill_per_bucket_dropped_when_the_cache_or_the_weights_change(ckpt_untied, monkeypatch, tmp_path):
    options = ModelOptions(prefill_bucketed=True)
    engine = AsrEngine(
        EngineOptions(model=str(ckpt_untied), device="cpu", dtype="fp32", variant="int8", model_options=options)
    )
    model = engine.model
    made = []
    real = StaticCall.__init__
    monkeypatch.setattr(StaticCall, "__init__", lambda self, *a, **k: made.append(k["name"]) or real(self, *a, **k))
    first = [engine.pipeline.run(synth_audio(s, seed=2), None, "", 4).ids for s in (2.5, 3.0, 6.5)]
    assert made == ["prefill", "prefill"] and sorted(model._prefills) == [64, 128]  # 48, 54 and 100 positions
    calls = dict(model._prefills)
    model.ensure_capacity(model.cache.max_len + 1)  # a new cache: the old one's addresses are gone
    assert model._prefills == {}
    assert [engine.pipeline.run(synth_audio(s, seed=2), None, "", 4).ids for s in (2.5, 3.0, 6.5)] == first
    assert model._prefills[64] is not calls[64]
    calls = dict(model._prefills)
    engine.set_adapters([str(write_adapter(tmp_path / "a", seed=1))])  # int8 layers quantized again: new addresses
    changed = engine.pipeline.run(synth_audio(2.5, seed=2), None, "", 4).ids
    assert model._prefills[64] is not calls[64] and list(model._prefills) == [64]
    engine.set_adapters([])
    assert engine.pipeline.run(synth_audio(2.5, seed=2), None, "", 4).ids == first[0] != changed


def test_the_warm_up_builds_every_bucket_so_that_no_dictation_builds_one(ckpt_untied, monkeypatch):
    options = ModelOptions(prefill_bucketed=True, rows_bucketed=True, encoder_bucketed=True)
    engine = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu", dtype="fp32", model_options=options))
    engine.warm_up()
    model = engine.model
    assert sorted(model.audio_tower._graphs) == list(encoder_mod.ENCODER_BUCKETS)
    assert sorted(model._prefills) == [b for b in model_mod.PREFILL_BUCKETS if b <= model.cache.max_len]
    assert sorted(model._rows) == list(model_mod.ROW_BUCKETS)
    made = []
    real = StaticCall.__init__
    monkeypatch.setattr(StaticCall, "__init__", lambda self, *a, **k: made.append(1) or real(self, *a, **k))
    for seconds in (1.5, 10.0, 25.0):
        audio = synth_audio(seconds, seed=8)
        want = engine.transcribe(audio, max_new_tokens=4).token_ids
        stream = engine.stream(max_new_tokens=4)
        stream.feed(audio)  # the windows extended, then the tail and a draft check at the finish
        assert stream.finish(draft_ids=want[:2]).token_ids == want
    assert made == []


def test_a_static_call_made_in_inference_mode_runs_outside_it_too():
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with torch.inference_mode():
        call = StaticCall(double, [torch.ones(3)], capture=False, name="test")
        assert torch.equal(call([torch.ones(3)]), torch.full((3,), 2.0))
    assert torch.equal(call([torch.arange(3.0)]), torch.tensor([0.0, 2.0, 4.0]))
    assert not call.captured and not call.failed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_conv_weights_are_channels_last_and_a_chunk_gives_the_same_rows_in_any_batch(dtype):
    """The real model's conv stack (480 channels) on the CPU: channels-last weights (faster with
    oneDNN), and each 1-s chunk's rows bit for bit the same whether it runs alone, with its window or
    with the whole clip, as streaming (a window at a time) and transcribe (the clip) need."""
    from dictation.asr.config import AudioEncoderConfig

    torch.manual_seed(0)
    cfg = AudioEncoderConfig(
        d_model=64, encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=128, output_dim=64
    )
    encoder = encoder_mod.AudioEncoder(cfg).to(dtype).eval()
    assert encoder.conv2d2.weight.is_contiguous(memory_format=torch.channels_last)
    assert not encoder.conv2d2.weight.is_contiguous()
    features = torch.randn(128, 2400).to(dtype)  # 24 chunks
    with torch.inference_mode():
        whole = encoder.conv_tokens(features).view(24, 13, -1)
        for start, count in ((0, 1), (5, 1), (23, 1), (0, 2), (8, 8), (16, 8), (3, 21)):
            part = encoder.conv_tokens(features[:, start * 100 : (start + count) * 100], clip_frames=2400)
            assert torch.equal(part.view(count, 13, -1), whole[start : start + count]), (start, count)


def test_the_default_layout_is_kept_where_channels_last_is_off():
    from dictation.asr.config import AudioEncoderConfig

    cfg = AudioEncoderConfig(d_model=64, encoder_layers=0, encoder_attention_heads=4)
    encoder = encoder_mod.AudioEncoder(cfg, ModelOptions(channels_last_on_cpu=False))
    assert encoder.conv2d2.weight.is_contiguous() and not encoder._channels_last
    encoder.use_options(ModelOptions())  # the default: laid out channels-last again, and back
    assert encoder._channels_last and not encoder.conv2d2.weight.is_contiguous()
    encoder.use_options(ModelOptions(channels_last_on_cpu=False))
    assert encoder.conv2d2.weight.is_contiguous() and not encoder._channels_last


# --- rows after the cached prompt ----------------------------------------------------------------------


def test_bucketed_rows_continue_the_cache_as_the_unpadded_rows_do(engine, monkeypatch):
    """The prompt tail after a streamed prompt (``prefill(start=...)``, ``extend``) and a draft check
    (``forward_tokens``), padded to a row bucket with their first position on the device."""
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(6.5, seed=3))
    total = embeds.shape[1]
    cut = total - 30
    tokens = torch.tensor([11, 402, 7, 93, 1500, 8])
    runs = {}
    with torch.inference_mode():
        for bucketed in (False, True):
            use(monkeypatch, model, rows_bucketed=bucketed)
            model.release_cache()
            model.prefill(embeds[:, :cut], 8)  # from position 0: unbucketed on the CPU either way
            model.cache.keys[..., cut:, :].fill_(1e4)  # stale entries after the prompt: never seen
            model.cache.values[..., cut:, :].fill_(-1e4)
            logits = model.prefill(embeds[:, cut:], 8, start=cut)
            checked = model.forward_tokens(tokens, total)
            keys = model.cache.keys[..., : total + len(tokens), :].clone()
            runs[bucketed] = (logits, checked, keys, model.cache.values[..., total + len(tokens) :, :].clone())
    assert sorted(model._rows) == [16, 32, 128]  # the prompt's first 70 positions, the 30-row tail, 6 ids
    (want, want_checked, want_keys, _), (got, got_checked, got_keys, after) = runs[False], runs[True]
    assert int(got.argmax()) == int(want.argmax())
    assert got_checked.argmax(-1).tolist() == want_checked.argmax(-1).tolist()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))
    torch.testing.assert_close(got_checked, want_checked, rtol=0, atol=1e-5 * float(want_checked.abs().max()))
    torch.testing.assert_close(got_keys, want_keys, rtol=0, atol=1e-5 * float(want_keys.abs().max()))
    # The padding wrote the 10 positions after the draft's 6 rows, nothing after them.
    assert (after[..., :10, :] != -1e4).all() and (after[..., 10:, :] == -1e4).all()


def test_a_row_bucket_is_only_used_where_it_fits_the_cache(engine, monkeypatch):
    model = engine.model
    use(monkeypatch, model, rows_bucketed=True)
    with torch.inference_mode():
        model.release_cache()
        assert model.row_bucket(0, 5) is None  # no cache yet
        model.ensure_capacity(600)
    size = model.cache.max_len
    assert model.row_bucket(3, 5) == 16 and model.row_bucket(3, 200) == 256 and model.row_bucket(0, 512) == 512
    assert model.row_bucket(0, 513) is None  # longer than every bucket: unpadded
    assert model.row_bucket(size - 16, 16) == 16 and model.row_bucket(size - 15, 16) is None  # past the end
    use(monkeypatch, model, rows_bucketed=None)
    assert model.row_bucket(3, 5) is None  # the CPU's default: unpadded


@pytest.mark.parametrize("seconds", [9.0, 17.0])
def test_streaming_and_drafts_with_bucketed_rows_give_the_whole_clip_ids(engine, monkeypatch, seconds):
    audio = synth_audio(seconds, seed=int(seconds))
    want = engine.transcribe(audio, max_new_tokens=12).token_ids
    model = engine.model
    use(monkeypatch, model, rows_bucketed=True)
    model._drop_prefills()
    made = []
    real = StaticCall.__init__
    monkeypatch.setattr(StaticCall, "__init__", lambda self, *a, **k: made.append(k["name"]) or real(self, *a, **k))
    for draft in (None, want[:8] + [(t + 1) % 1000 for t in want[8:]]):
        stream = engine.stream(max_new_tokens=12)
        for i in range(0, len(audio), 4000):
            stream.feed(audio[i : i + 4000])
        got = stream.finish(draft_ids=draft)
        assert got.token_ids == want
        if draft is not None:
            assert got.timings["draft_accepted"] >= 8
    # The windows extended while feeding (104 rows, the first with the prompt head), the tail at the
    # finish and the draft check all ran as bucketed rows.
    assert made and set(made) == {"decoder rows"} and 128 in model._rows


def test_on_the_cpu_the_conv_stack_runs_a_few_chunks_at_a_time_with_the_same_rows(monkeypatch):
    """Memory, not numbers: the CPU's conv batch keeps the encoder's peak down (docs/engine.md, "CPU
    memory"); every chunk's rows are those of one call over all chunks. The encoder hands the heap's
    freed pages back before the prefill."""
    from dictation.asr.config import AudioEncoderConfig

    torch.manual_seed(0)
    cfg = AudioEncoderConfig(
        d_model=64, encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=128, output_dim=64
    )
    encoder = encoder_mod.AudioEncoder(cfg).eval()
    features = torch.randn(128, 1000)  # 10 chunks
    calls, released = [], []
    first = encoder._first_conv

    def counted(part):
        calls.append(part.shape[0])
        return first(part)

    monkeypatch.setattr(encoder, "_first_conv", counted)
    monkeypatch.setattr(encoder_mod, "release_freed_memory", lambda: released.append(1))
    with torch.inference_mode():
        default = encoder.conv_tokens(features)
        assert calls == [encoder.options.conv_batch_cpu] * (10 // encoder.options.conv_batch_cpu)
        assert torch.equal(default, encoder.conv_tokens(features, batch=encoder.options.conv_batch))
        assert released == []
        encoder(features)
    assert released == [1]
