"""Streaming transcription: windows encoded and prefilled while recording, same result."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from dictation.asr import AsrEngine, AudioError, EngineOptions
from dictation.asr.decode import longform
from dictation.asr.decode.streaming import StreamingTranscription
from dictation.asr.nn.features import HOP_LENGTH, LogMel, n_frames
from tests.oracle import synth_audio

SR = 16000
MAX_NEW = 12
WINDOW_SAMPLES = 800 * HOP_LENGTH  # one 8-s encoder window


def feed_randomly(stream, audio: np.ndarray, seed: int, max_chunk: int = 40000) -> None:
    rng = np.random.default_rng(seed)
    i = 0
    while i < len(audio):
        n = int(rng.integers(1, max_chunk))
        stream.feed(audio[i : i + n])
        i += n


def streamed_windows(n_samples: int) -> int:
    """Windows whose last frame reads no reflected end sample before the recording ends."""
    return max(0, (n_samples - 40) // WINDOW_SAMPLES)


def loud_at_the_end(seconds: float, seed: int) -> np.ndarray:
    """Quiet speech, then the loudest second last: early windows see a smaller running max."""
    audio = synth_audio(seconds, seed=seed) * 0.02
    audio[-SR:] = synth_audio(1.0, seed=seed + 1) * 1.8  # peak 0.9
    return audio


def encoder_calls(engine, monkeypatch) -> list[int]:
    """From now on, the frame count of every audio-encoder call is appended to the returned list."""
    tower = engine.model.audio_tower
    calls: list[int] = []
    real = tower.forward

    def spy(features, clip_frames=None):
        calls.append(features.shape[-1])
        return real(features, clip_frames)

    monkeypatch.setattr(tower, "forward", spy)
    return calls


@pytest.fixture
def engine(ckpt_untied, engine_factory):
    return engine_factory(ckpt_untied)


# --- features ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [201, 359, 360, 16000, 16159, 128000, 128040, 136000, 272160, 400001])
def test_frame_count_and_windowed_frames_equal_the_whole_clip(n):
    audio = synth_audio(n / SR, seed=n % 7)
    mel = LogMel()
    whole = mel(audio)
    assert whole.shape[1] == n // 160 == n_frames(n)
    spec = torch.stft(torch.from_numpy(audio), 400, 160, window=mel.window, center=True, return_complex=True)
    assert spec.shape[1] == n // 160 + 1  # the centred STFT has one more frame; it is dropped
    total = n_frames(n)
    raw = torch.cat([mel.log_spec_frames(audio, a, min(a + 800, total)) for a in range(0, total, 800)], dim=1)
    assert torch.equal(LogMel.floor(raw, raw.max()), whole)


def test_a_window_is_final_once_its_last_frame_reads_no_reflected_sample():
    audio = synth_audio(17.0, seed=2)
    mel = LogMel()
    full = mel.log_spec_frames(audio, 0, n_frames(len(audio)))
    for w in (0, 1):
        start, stop = 800 * w, 800 * (w + 1)
        ready = (stop - 1) * 160 + 200  # the last frame's window ends here
        assert ready == WINDOW_SAMPLES * (w + 1) + 40
        assert torch.equal(mel.log_spec_frames(audio[:ready], start, stop), full[:, start:stop])
        # one sample less: the last frame reflects the clip's end and differs
        early = mel.log_spec_frames(audio[: ready - 1], start, stop)
        assert torch.equal(early[:, :-1], full[:, start : stop - 1])
        assert not torch.equal(early[:, -1], full[:, stop - 1])


# --- streaming == whole clip -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n_samples",
    [int(0.6 * SR), 5 * SR, 8 * SR, 8 * SR + 40, int(8.5 * SR), 17 * SR, 25 * SR + 123],
    ids=["0.6s", "5s", "8s", "8s+40", "8.5s", "17s", "25s"],
)
def test_stream_equals_whole_clip(engine, n_samples):
    audio = synth_audio(n_samples / SR, seed=n_samples % 11)
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    feed_randomly(stream, audio, seed=n_samples)
    assert stream.windows_done == streamed_windows(n_samples)
    got = stream.finish()
    assert got.token_ids == whole.token_ids
    assert (got.text, got.language, got.truncated) == (whole.text, whole.language, whole.truncated)
    assert got.audio_seconds == pytest.approx(whole.audio_seconds)
    assert got.timings["stream_windows"] == streamed_windows(n_samples)


def test_context_and_forced_language(engine):
    audio = synth_audio(17.0, seed=5)
    for language, context in (("de", "Grüße an Dr. Müller"), (None, "Qwen3-ASR, PyTorch"), ("ja", "")):
        whole = engine.transcribe(audio, language=language, context=context, max_new_tokens=MAX_NEW)
        stream = engine.stream(language=language, context=context, max_new_tokens=MAX_NEW)
        feed_randomly(stream, audio, seed=len(context))
        got = stream.finish()
        assert got.token_ids == whole.token_ids and got.text == whole.text
        assert got.language == whole.language
    assert got.language == "Japanese"


def test_default_budget_scales_with_the_final_length(engine):
    audio = synth_audio(9.0, seed=9)
    whole = engine.transcribe(audio)  # 64 + 10/s tokens
    stream = engine.stream()
    stream.feed(audio)
    assert stream.finish().token_ids == whole.token_ids


def test_loudest_part_last_reencodes_the_early_windows(engine):
    audio = loud_at_the_end(25.0, seed=3)
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    feed_randomly(stream, audio, seed=1)
    assert stream.windows_done == 3
    # the running max grew at the end: the windows' features under it are not the final ones
    final = engine.pipeline.mel(audio)
    first = stream._mel.floor(stream._raw[0], stream._floors[0] + 8.0)
    assert not torch.equal(first, final[:, :800])
    got = stream.finish()
    assert got.token_ids == whole.token_ids and got.text == whole.text
    assert got.timings["reencoded_windows"] == 3 and got.timings["finish_windows"] == 4


def test_only_windows_with_values_under_the_new_floor_are_redone(engine):
    # window 0: steady noise, every value far above any floor; windows 1-2: very quiet speech;
    # the last second: the loudest. Window 0 keeps its encoding, windows 1 and 2 change.
    rng = np.random.default_rng(0)
    audio = loud_at_the_end(25.0, seed=5)
    audio[:WINDOW_SAMPLES] = (0.05 * rng.standard_normal(WINDOW_SAMPLES)).astype(np.float32)
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    feed_randomly(stream, audio, seed=8)
    got = stream.finish()
    assert got.token_ids == whole.token_ids
    assert got.timings["reencoded_windows"] == 2 and got.timings["finish_windows"] == 3


def test_nothing_is_redone_when_the_first_window_is_the_loudest(engine):
    audio = synth_audio(25.0, seed=4) * 0.5
    audio[:SR] = synth_audio(1.0, seed=9) * 1.8
    stream = engine.stream(max_new_tokens=MAX_NEW)
    feed_randomly(stream, audio, seed=2)
    got = stream.finish()
    assert got.timings["reencoded_windows"] == 0 and got.timings["finish_windows"] == 1
    assert got.token_ids == engine.transcribe(audio, max_new_tokens=MAX_NEW).token_ids


def test_only_the_last_window_is_encoded_at_finish(engine, monkeypatch):
    audio = synth_audio(17.0, seed=6)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    calls = encoder_calls(engine, monkeypatch)
    feed_randomly(stream, audio, seed=3)
    assert calls == [800, 800]  # two windows during the recording
    calls.clear()
    got = stream.finish()
    assert calls == [100]  # at finish: the last second only
    assert got.timings["finish_windows"] == 1 and got.timings["reencoded_windows"] == 0
    # prompt positions computed at finish: the last second's 13 audio tokens and the prompt tail
    assert got.timings["finish_prefill_tokens"] == 13 + len(stream._tail_ids)


def test_first_logits_close_to_the_whole_clip(engine):
    audio = synth_audio(25.0, seed=8)
    ref = engine.pipeline.run(audio, None, "", MAX_NEW, keep_first_logits=True)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    feed_randomly(stream, audio, seed=4)
    got = stream._finish_streamed(stream._buf[: stream._n], keep_first_logits=True)
    assert got.ids == ref.ids
    diff = (got.first_logits - ref.first_logits).abs().max().item()
    assert diff < 1e-3, diff


# --- lifecycle -----------------------------------------------------------------------------------


def test_cancel_then_transcribe_and_stream_again(engine):
    audio = synth_audio(17.0, seed=7)
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    stream.feed(audio[: 10 * SR])
    assert stream.windows_done == 1
    stream.cancel()
    stream.feed(audio[10 * SR :])  # ignored
    with pytest.raises(RuntimeError):
        stream.finish()
    assert engine.transcribe(audio, max_new_tokens=MAX_NEW).token_ids == whole.token_ids
    again = engine.stream(max_new_tokens=MAX_NEW)
    again.feed(audio)
    assert again.finish().token_ids == whole.token_ids
    with pytest.raises(RuntimeError):
        again.finish()


def test_a_transcribe_between_feeds_takes_the_cache_and_the_stream_refills_it(engine):
    audio = synth_audio(25.0, seed=10)
    other = synth_audio(12.0, seed=11)
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    other_ids = engine.transcribe(other, max_new_tokens=MAX_NEW).token_ids
    stream = engine.stream(max_new_tokens=MAX_NEW)
    stream.feed(audio[: 9 * SR])
    assert engine.transcribe(other, max_new_tokens=MAX_NEW).token_ids == other_ids
    stream.feed(audio[9 * SR : 20 * SR])
    assert engine.transcribe(other, max_new_tokens=MAX_NEW).token_ids == other_ids  # after window 1
    stream.feed(audio[20 * SR :])
    got = stream.finish()
    assert got.token_ids == whole.token_ids
    assert got.timings["finish_prefill_tokens"] > 200  # the cache was refilled at finish


def test_feed_from_a_worker_thread(engine):
    audio = synth_audio(17.0, seed=12)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    worker = threading.Thread(target=feed_randomly, args=(stream, audio, 5))
    worker.start()
    worker.join()
    assert stream.finish().token_ids == engine.transcribe(audio, max_new_tokens=MAX_NEW).token_ids


def test_over_the_single_pass_limit_falls_back_to_split_transcription(engine, monkeypatch):
    monkeypatch.setattr(longform, "MAX_PASS_SECONDS", 10.0)
    audio = synth_audio(25.0, seed=13)
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    assert whole.chunks == 3
    stream = engine.stream(max_new_tokens=MAX_NEW)
    feed_randomly(stream, audio, seed=6)
    assert stream.windows_done == 0  # everything was dropped once past the limit
    got = stream.finish()
    assert got.chunks == 3 and got.token_ids == whole.token_ids and got.text == whole.text


def test_peak_over_one_falls_back(engine):
    audio = synth_audio(17.0, seed=14)
    audio[16 * SR] = 1.5  # the whole clip is scaled by 1/1.5
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    feed_randomly(stream, audio, seed=7)
    got = stream.finish()
    assert got.timings["stream_windows"] == 0 and got.token_ids == whole.token_ids


def test_unloaded_model_falls_back(ckpt_untied):
    engine = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu", dtype="fp32"))
    audio = synth_audio(17.0, seed=15)
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    stream.feed(audio[: 9 * SR])
    engine.unload()
    stream.feed(audio[9 * SR :])
    got = stream.finish()
    assert got.timings["stream_windows"] == 0 and got.token_ids == whole.token_ids


def test_bad_chunks_are_clear_errors(engine):
    stream = engine.stream()
    for bad, message in (
        (np.zeros((2, 100), np.float32), "1-D mono"),
        (np.zeros(100, np.int16), "float samples"),
        (np.full(10, np.inf, np.float32), "NaN or infinite"),
    ):
        with pytest.raises(AudioError, match=message):
            stream.feed(bad)
    stream.feed(np.zeros((50, 1), np.float32))  # a one-channel column is fine
    with pytest.raises(AudioError, match="too short"):
        stream.finish()


# --- finish(end=): trailing silence cut after the recording ---------------------------------------


@pytest.mark.parametrize(
    ("fed_s", "end"),
    [
        (20.0, 17 * SR),  # the cut lies after the last streamed window: nothing dropped
        (20.0, 15 * SR),  # window 1 (8-16 s) was streamed but reaches past the cut: dropped
        (20.0, 2 * WINDOW_SAMPLES + 40),  # the cut exactly where window 1 became final: kept
        (20.0, 2 * WINDOW_SAMPLES + 39),  # one sample less: dropped
        (17.0, 7 * SR),  # no window survives: the whole-clip path on audio[:end]
        (17.0, 0),
    ],
)
def test_finish_with_an_end_equals_transcribe_of_the_cut_clip(engine, fed_s, end):
    audio = synth_audio(fed_s, seed=21)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    feed_randomly(stream, audio, seed=int(fed_s))
    assert stream.windows_done == streamed_windows(len(audio))
    if end == 0:
        with pytest.raises(AudioError):
            engine.transcribe(audio[:0])
        with pytest.raises(AudioError):
            stream.finish(end=end)
        return
    whole = engine.transcribe(audio[:end], max_new_tokens=MAX_NEW)
    got = stream.finish(end=end)
    assert got.token_ids == whole.token_ids and got.text == whole.text
    assert got.audio_seconds == pytest.approx(end / SR)
    assert got.timings["stream_windows"] == streamed_windows(end)


def test_finish_with_an_end_before_the_loud_part_forgets_its_max(engine):
    # window 1 (8-16 s) holds the loudest second and raised the running max; the cut at 14 s drops
    # that window, so the clip's max is window 0's again and window 0's encoding stays valid
    audio = synth_audio(20.0, seed=22) * 0.02
    audio[:SR] = synth_audio(1.0, seed=24) * 0.3  # window 0 is louder than the rest of the cut clip
    audio[14 * SR : 15 * SR] = synth_audio(1.0, seed=23) * 1.8
    stream = engine.stream(max_new_tokens=MAX_NEW)
    feed_randomly(stream, audio, seed=5)
    assert stream.windows_done == 2
    end = 14 * SR
    got = stream.finish(end=end)
    whole = engine.transcribe(audio[:end], max_new_tokens=MAX_NEW)
    assert got.token_ids == whole.token_ids and got.text == whole.text
    assert got.timings["stream_windows"] == 1 and got.timings["reencoded_windows"] == 0


def test_finish_with_an_end_past_the_audio_is_refused(engine):
    stream = engine.stream(max_new_tokens=MAX_NEW)
    stream.feed(synth_audio(2.0, seed=1))
    with pytest.raises(ValueError, match="only 32000 samples"):
        stream.finish(end=32001)


# --- preview(): the audio so far, while recording --------------------------------------------------


def test_preview_before_any_window_is_transcribe_of_the_audio_so_far(engine):
    audio = synth_audio(5.0, seed=31)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    stream.feed(audio)
    preview = stream.preview()
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    assert preview.token_ids == whole.token_ids and preview.text == whole.text
    assert preview.complete and preview.seconds == pytest.approx(5.0)


def test_preview_with_windows_cached_equals_transcribe_when_the_floor_holds(engine):
    audio = synth_audio(19.0, seed=32) * 0.5
    audio[:SR] = synth_audio(1.0, seed=9) * 1.8  # the first second is the loudest: one floor throughout
    stream = engine.stream(max_new_tokens=MAX_NEW)
    feed_randomly(stream, audio[: 13 * SR], seed=6)
    assert stream.windows_done == 1
    first = stream.preview()
    assert first.token_ids == engine.transcribe(audio[: 13 * SR], max_new_tokens=MAX_NEW).token_ids
    feed_randomly(stream, audio[13 * SR :], seed=7)
    assert stream.windows_done == 2
    second = stream.preview(draft_ids=first.token_ids)
    whole = engine.transcribe(audio, max_new_tokens=MAX_NEW)
    assert second.token_ids == whole.token_ids
    # previews leave no trace: the final result is the whole clip's, and the draft is verified
    got = stream.finish(draft_ids=second.token_ids)
    assert got.token_ids == whole.token_ids
    assert got.timings["draft_accepted"] == len(whole.token_ids)


def test_preview_encodes_only_the_partial_window(engine, monkeypatch):
    audio = synth_audio(11.0, seed=33)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    stream.feed(audio)
    calls = encoder_calls(engine, monkeypatch)
    assert stream.preview() is not None
    assert calls == [300]  # frames 800..1099: the 3 s after the streamed window


def test_preview_stops_when_asked_and_the_stream_still_finishes_exactly(engine):
    audio = synth_audio(12.0, seed=34)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    stream.feed(audio)
    calls = []

    def stop_after_three() -> bool:
        calls.append(1)
        return len(calls) >= 3

    preview = stream.preview(should_stop=stop_after_three)
    assert not preview.complete and len(preview.token_ids) == 3
    full = stream.preview()
    assert full.complete and full.token_ids[:3] == preview.token_ids
    assert stream.finish().token_ids == engine.transcribe(audio, max_new_tokens=MAX_NEW).token_ids


def test_preview_is_none_when_there_is_nothing_to_preview(engine):
    stream = engine.stream(max_new_tokens=MAX_NEW)
    assert stream.preview() is None  # no audio
    loud = synth_audio(3.0, seed=35) * 3.0  # peak over 1: finish will transcribe the whole clip
    stream.feed(loud)
    assert stream.preview() is None
    stream.cancel()
    assert stream.preview() is None


class _OnlyThePublicFace:
    """An engine reduced to what a stream may use: prepare, current_pipeline, transcribe."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def prepare(self) -> None:
        self._engine.prepare()

    @property
    def current_pipeline(self):
        return self._engine.current_pipeline

    def transcribe(self, samples, **kwargs):
        return self._engine.transcribe(samples, **kwargs)


def test_a_stream_needs_only_the_engines_public_pass_api(engine):
    """Streaming runs on the pass pipeline the engine hands out (decode/pipeline.py), not on its
    private fields: through a facade with only the public surface it gives the whole clip's ids."""
    audio = synth_audio(19.0, seed=21)
    want = engine.transcribe(audio, max_new_tokens=12).token_ids
    stream = StreamingTranscription(_OnlyThePublicFace(engine), max_new_tokens=12)
    feed_randomly(stream, audio, seed=3)
    assert stream.windows_done == 2
    assert stream.finish().token_ids == want


def test_new_weights_give_a_new_pipeline_and_stale_streams_fall_back(engine):
    """The engine makes a new pipeline whenever the weights change; a stream started on the old one
    does not use its early work (it transcribes the whole clip, with the new weights)."""
    audio = synth_audio(17.0, seed=22)
    stream = engine.stream(max_new_tokens=8)
    stream.feed(audio)
    before = engine.current_pipeline
    engine.unload()
    assert engine.current_pipeline is None
    result = stream.finish()
    assert engine.current_pipeline is not before and result.timings["stream_windows"] == 0.0
    assert result.token_ids == engine.transcribe(audio, max_new_tokens=8).token_ids
