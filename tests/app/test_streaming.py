"""Takes transcribed while they are recorded: the controller with a real tiny engine whose
streams are spied on, and fake microphones that deliver the take bit by bit while it records."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import threading
import time

import numpy as np
import pytest

from dictation.app import engine_worker, workers
from dictation.app import overlay as overlay_module
from dictation.app.overlay import Overlay
from dictation.app.tray import Tray
from dictation.asr import AsrEngine
from dictation.asr.decode.streaming import StreamingTranscription
from dictation.audio.trim import find_speech, trim_silence
from dictation.config import Outcome, Settings
from dictation.session import Status
from tests.app.controller_fakes import RecorderFactory
from tests.oracle import synth_audio

SR = 16_000


@pytest.fixture(autouse=True)
def fast_streaming(monkeypatch):
    """Audio handed on every 10 ms instead of 500 ms, previews allowed every 50 ms: same code, less waiting."""
    monkeypatch.setattr(workers, "STREAM_PULL_MS", 10)
    monkeypatch.setattr(engine_worker, "PREVIEW_MIN_INTERVAL_S", 0.05)


def take_audio(speech_s: float = 10.0, seed: int = 3) -> np.ndarray:
    """Room noise, speech, then 1.5 s of room noise: trimming cuts both ends."""
    rng = np.random.default_rng(seed)

    def room(seconds: float) -> np.ndarray:
        return (rng.standard_normal(round(seconds * SR)) * 0.002).astype(np.float32)

    audio = np.concatenate([room(0.8), synth_audio(speech_s, seed=seed), room(1.5)])
    span = find_speech(audio)
    assert span.has_speech and span.start > 0 and span.end < len(audio)
    return audio


class SpyStream(StreamingTranscription):
    """The engine's stream, recording what the app did with it."""

    fail_feed_at: int | None = None  # the n-th feed (1-based) raises
    hold_preview: threading.Event | None = None  # a preview polls should_stop until it says stop

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fed: list[np.ndarray] = []
        self.previews: list = []
        self.finish_args: tuple | None = None
        self.windows_at_finish: int | None = None
        self.cancelled = False
        self.preview_running = threading.Event()

    def feed(self, samples):
        self.fed.append(np.array(samples, copy=True))
        if self.fail_feed_at == len(self.fed):
            raise RuntimeError("the GPU fell off the bus")
        super().feed(samples)

    def preview(self, *, draft_ids=None, should_stop=None):
        if self.hold_preview is not None:

            def held_stop() -> bool:
                # The first token of the first preview takes "long": until the app interrupts it, or
                # 8 s, so that a missing interrupt fails the test instead of hanging it.
                if not self.preview_running.is_set():
                    self.preview_running.set()
                    deadline = time.monotonic() + 8
                    while not should_stop() and time.monotonic() < deadline:
                        if self.hold_preview.wait(0.01):
                            break
                return should_stop()

            result = super().preview(draft_ids=draft_ids, should_stop=held_stop)
        else:
            result = super().preview(draft_ids=draft_ids, should_stop=should_stop)
        self.previews.append(result)
        return result

    def finish(self, draft_ids=None, *, end=None):
        self.finish_args = (None if draft_ids is None else list(draft_ids), end)
        self.windows_at_finish = self.windows_done
        return super().finish(draft_ids, end=end)

    def cancel(self):
        self.cancelled = True
        super().cancel()


def spy_engine(streams: list[SpyStream], transcribed: list[np.ndarray] | None = None, **stream_attrs):
    class SpyEngine(AsrEngine):
        def stream(self, *, language=None, context="", max_new_tokens=None):
            stream = SpyStream(self, language=language, context=context, max_new_tokens=max_new_tokens)
            for name, value in stream_attrs.items():
                setattr(stream, name, value)
            streams.append(stream)
            return stream

        def transcribe(self, samples, *args, **kwargs):
            if transcribed is not None:
                transcribed.append(np.array(samples, copy=True))
            return super().transcribe(samples, *args, **kwargs)

    return SpyEngine


def expected_text(engine_factory, ckpt, audio: np.ndarray) -> str:
    return engine_factory(ckpt).transcribe(audio).text + " "  # the trailing space setting (on by default)


def test_a_long_take_is_encoded_while_recording_and_types_the_text_of_its_trailing_trimmed_audio(
    rig, qtbot, engine_factory, ckpt_untied
):
    streams: list[SpyStream] = []
    r = rig(engine_factory=spy_engine(streams), recorders=RecorderFactory(arrive_per_read=3000))
    r.start()
    r.wait_status(Status.IDLE)
    audio = take_audio(10.0)
    r.hold(audio)
    # the first 8-s window is encoded and prefilled while the key is still held
    qtbot.waitUntil(lambda: bool(streams) and streams[0].windows_done >= 1, timeout=20_000)
    assert r.c.status is Status.RECORDING
    r.release(audio)
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)

    (stream,) = streams
    end = find_speech(audio).end
    assert r.chain.delivered == [expected_text(engine_factory, ckpt_untied, audio[:end])]
    # the stream got the take's samples exactly: in order, none lost or repeated, in several chunks
    assert len(stream.fed) > 3
    np.testing.assert_array_equal(np.concatenate(stream.fed), audio)
    reads = r.recorders.recorder.reads
    assert [start for start, _ in reads] == list(np.cumsum([0] + [n for _, n in reads])[:-1])
    assert stream.finish_args[1] == end and stream.windows_at_finish >= 1
    entry = r.history.recent(1)[0]
    assert entry.streamed and entry.timings["stream_windows"] >= 1


def test_audio_read_past_the_end_of_the_take_is_cut_off_at_the_take(rig, qtbot, engine_factory, ckpt_untied):
    """The recorder may hand on audio from after the release's post-roll; the saved take ends
    earlier, and the text is that of the saved take."""
    streams: list[SpyStream] = []
    r = rig(engine_factory=spy_engine(streams))
    r.start()
    r.wait_status(Status.IDLE)
    audio = take_audio(9.0, seed=4)
    r.recorders.next_samples(audio)
    r.recorders.recorder.take_frames = len(audio) - SR  # the last second came after the take's end
    r.hold(audio)
    qtbot.waitUntil(lambda: bool(streams) and sum(map(len, streams[0].fed)) == len(audio), timeout=20_000)
    r.release(audio)
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    take = audio[: len(audio) - SR]
    end = find_speech(take).end
    assert streams[0].finish_args[1] == end
    assert r.chain.delivered == [expected_text(engine_factory, ckpt_untied, take[:end])]


@pytest.mark.parametrize("rate", [44_100, 48_000])
def test_a_microphone_not_at_16k_is_transcribed_after_the_recording(rig, qtbot, engine_factory, ckpt_untied, rate):
    streams: list[SpyStream] = []
    r = rig(engine_factory=spy_engine(streams), recorders=RecorderFactory(rate=rate))
    r.start()
    r.wait_status(Status.IDLE)
    audio = take_audio(3.0)
    r.dictate(audio)
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert streams == []  # nothing reached the engine while recording (the reads only went to disk)
    assert r.chain.delivered == [expected_text(engine_factory, ckpt_untied, trim_silence(audio))]  # both ends
    assert not r.history.recent(1)[0].streamed


def test_a_failing_feed_falls_back_to_the_saved_take_and_the_text_is_typed(rig, qtbot, engine_factory, ckpt_untied):
    streams: list[SpyStream] = []
    transcribed: list[np.ndarray] = []
    r = rig(
        engine_factory=spy_engine(streams, transcribed, fail_feed_at=2),
        recorders=RecorderFactory(arrive_per_read=4000),
    )
    r.start()
    r.wait_status(Status.IDLE)
    audio = take_audio(4.0)
    r.hold(audio)
    qtbot.waitUntil(lambda: bool(streams) and streams[0].cancelled, timeout=20_000)
    r.release(audio)
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    end = find_speech(audio).end
    assert streams[0].finish_args is None  # dropped at the failure
    assert len(transcribed) == 1
    np.testing.assert_array_equal(transcribed[0], audio[:end])  # the saved take, trimmed the same way
    assert r.chain.delivered == [expected_text(engine_factory, ckpt_untied, audio[:end])]


def test_a_microphone_read_failing_mid_take_still_streams_the_rest_from_the_saved_take(
    rig, qtbot, engine_factory, ckpt_untied
):
    streams: list[SpyStream] = []
    r = rig(engine_factory=spy_engine(streams), recorders=RecorderFactory(arrive_per_read=4000))
    r.start()
    r.wait_status(Status.IDLE)
    audio = take_audio(4.0)
    r.hold(audio)
    qtbot.waitUntil(lambda: bool(streams) and len(streams[0].fed) >= 2, timeout=20_000)
    r.recorders.recorder.fail_reads = True
    r.release(audio)
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    np.testing.assert_array_equal(np.concatenate(streams[0].fed), audio)  # the rest came at the finish
    assert r.chain.delivered == [expected_text(engine_factory, ckpt_untied, audio[: find_speech(audio).end])]


def test_cancel_mid_take_cancels_the_stream_and_types_nothing(rig, qtbot):
    streams: list[SpyStream] = []
    r = rig(engine_factory=spy_engine(streams), recorders=RecorderFactory(arrive_per_read=4000))
    r.start()
    r.wait_status(Status.IDLE)
    r.hold(take_audio(4.0))
    qtbot.waitUntil(lambda: bool(streams) and len(streams[0].fed) >= 2, timeout=20_000)
    r.hotkeys.press("cancel")
    r.wait_status(Status.IDLE)
    qtbot.waitUntil(lambda: streams[0].cancelled, timeout=10_000)
    r.hotkeys.release()
    assert streams[0].finish_args is None and r.chain.delivered == [] and r.history.count() == 0
    assert r.c.preview_text == ""


def test_a_model_reload_mid_take_drops_the_stream_and_the_new_model_transcribes_the_take(
    rig, qtbot, engine_factory, ckpt_untied, ckpt_tied
):
    streams: list[SpyStream] = []
    r = rig(engine_factory=spy_engine(streams), recorders=RecorderFactory(arrive_per_read=4000))
    r.start()
    r.wait_status(Status.IDLE)
    audio = take_audio(4.0)
    r.hold(audio)
    qtbot.waitUntil(lambda: bool(streams) and len(streams[0].fed) >= 2, timeout=20_000)
    s = r.c.settings
    assert r.c.apply_settings(s.replace(engine=s.engine.replace(model=str(ckpt_tied)))) == []
    qtbot.waitUntil(lambda: streams[0].cancelled, timeout=20_000)
    r.release(audio)
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert streams[0].finish_args is None
    assert r.chain.delivered == [expected_text(engine_factory, ckpt_tied, audio[: find_speech(audio).end])]


def test_live_previews_appear_while_recording_in_the_tooltip_without_an_overlay(rig, qtbot, engine_factory):
    streams: list[SpyStream] = []
    r = rig(engine_factory=spy_engine(streams), recorders=RecorderFactory(arrive_per_read=2000))
    tray = Tray(r.c, lambda page: None, lambda: None, force_window=True)
    shown: list[tuple[Status, str]] = []
    r.c.preview_changed.connect(lambda text: shown.append((r.c.status, text)))
    r.start()
    r.wait_status(Status.IDLE)
    audio = take_audio(6.0)
    r.hold(audio)
    qtbot.waitUntil(lambda: any(text for _, text in shown), timeout=20_000)
    text = r.c.preview_text
    assert text and shown[-1] == (Status.RECORDING, text)
    assert any(p is not None and p.text == text for p in streams[0].previews)
    # offscreen has no overlay: the tooltip shows it (its newest words, when long)
    assert "Heard so far: " + (text if len(text) <= 120 else "…" + text[-119:]) in tray.tooltip()
    assert tray.window.status_label.toolTip() == tray.tooltip()
    r.release(audio)
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    r.wait_status(Status.IDLE)
    assert len(r.chain.delivered) == 1  # previews are never typed
    assert r.c.preview_text == "" and "Heard" not in tray.tooltip()
    draft, _ = streams[0].finish_args
    complete = [p for p in streams[0].previews if p is not None and p.complete]
    assert draft is not None and any(draft == p.token_ids for p in streams[0].previews) and complete


def test_the_overlay_shows_the_newest_words_of_the_preview_and_never_takes_focus(rig, qtbot):
    from PySide6.QtCore import Qt

    r = rig()
    overlay = Overlay(r.c)
    overlay.supported = True  # offscreen has no screen; draw it anyway
    r.start()
    r.wait_status(Status.IDLE)
    r.hold(take_audio(2.0))
    qtbot.waitUntil(overlay.isVisible, timeout=5000)
    words = " ".join(f"word{i}" for i in range(60))
    r.c._s.engine_worker.preview_ready.emit(r.c.session.recording_take_id, words)  # as from the engine
    qtbot.waitUntil(lambda: r.c.preview_text == words, timeout=5000)  # routed onto the GUI thread: queued
    line = overlay.preview_line()
    assert line.startswith("…") and line.endswith("word59") and len(line) < len(words)
    assert overlay.height() > overlay_module.HEIGHT  # a second line for the text
    overlay.grab()  # paints without error
    flags = overlay.windowFlags()
    assert flags & Qt.WindowType.WindowDoesNotAcceptFocus and flags & Qt.WindowType.WindowTransparentForInput
    r.release(take_audio(2.0))
    r.wait_status(Status.IDLE)
    assert overlay.preview_line() == ""


def test_the_release_interrupts_a_running_preview_and_the_finish_follows(rig, qtbot, engine_factory, ckpt_untied):
    streams: list[SpyStream] = []
    never = threading.Event()  # nothing sets it: only the interrupt ends the preview
    r = rig(engine_factory=spy_engine(streams, hold_preview=never), recorders=RecorderFactory(arrive_per_read=8000))
    r.start()
    r.wait_status(Status.IDLE)
    audio = take_audio(3.0)
    r.hold(audio)
    qtbot.waitUntil(lambda: bool(streams) and streams[0].preview_running.is_set(), timeout=20_000)
    r.release(audio)
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=10_000)
    (stream,) = streams
    assert stream.previews and stream.previews[-1].complete is False  # stopped early by the release
    assert r.chain.delivered == [expected_text(engine_factory, ckpt_untied, audio[: find_speech(audio).end])]
    assert r.c.preview_text == ""  # an interrupted preview is never shown


def test_streaming_off_transcribes_after_the_recording_and_trims_both_ends(rig, qtbot, engine_factory, ckpt_untied):
    streams: list[SpyStream] = []
    settings = Settings()
    settings = settings.replace(
        engine=settings.engine.replace(model=str(ckpt_untied), device="cpu", stream_while_recording=False)
    )
    r = rig(settings, engine_factory=spy_engine(streams), recorders=RecorderFactory(arrive_per_read=4000))
    r.start()
    r.wait_status(Status.IDLE)
    audio = take_audio(3.0)
    r.dictate(audio)
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert streams == []  # nothing reached the engine while recording (the reads only went to disk)
    assert r.chain.delivered == [expected_text(engine_factory, ckpt_untied, trim_silence(audio))]


def test_live_preview_off_streams_without_previews(rig, qtbot, ckpt_untied):
    streams: list[SpyStream] = []
    settings = Settings()
    settings = settings.replace(
        engine=settings.engine.replace(model=str(ckpt_untied), device="cpu"),
        general=settings.general.replace(live_preview=False),
    )
    r = rig(settings, engine_factory=spy_engine(streams), recorders=RecorderFactory(arrive_per_read=2000))
    shown: list[str] = []
    r.c.preview_changed.connect(shown.append)
    r.start()
    r.wait_status(Status.IDLE)
    audio = take_audio(9.0)
    r.hold(audio)
    qtbot.waitUntil(lambda: bool(streams) and streams[0].windows_done >= 1, timeout=20_000)
    r.release(audio)
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert streams[0].previews == [] and not any(shown)
    assert streams[0].finish_args == (None, find_speech(audio).end)


def test_retranscribing_a_streamed_take_trims_only_its_end_again(rig, qtbot):
    from dictation.audio.wav import load_audio_16k

    streams: list[SpyStream] = []
    transcribed: list[np.ndarray] = []
    r = rig(engine_factory=spy_engine(streams, transcribed))
    r.start()
    r.wait_status(Status.IDLE)
    audio = take_audio(3.0)
    r.dictate(audio)
    qtbot.waitUntil(lambda: r.history.count() == 1 and bool(r.history.recent(1)[0].text), timeout=20_000)
    entry = r.history.recent(1)[0]
    qtbot.waitUntil(lambda: r.history.get(entry.id).outcome == Outcome.PASTED, timeout=20_000)
    before = len(transcribed)
    r.c.retranscribe_entry(entry.id)
    qtbot.waitUntil(lambda: len(transcribed) == before + 1, timeout=20_000)
    saved = load_audio_16k(entry.audio_path)
    np.testing.assert_array_equal(transcribed[-1], saved[: find_speech(saved).end])
    qtbot.waitUntil(lambda: any("Transcribed again" in m for _, m in r.notes), timeout=20_000)
    assert r.history.get(entry.id).streamed  # a second re-transcription trims alike


def test_chunks_that_queue_up_while_the_engine_is_busy_are_fed_together_with_one_preview(qtbot, ckpt_untied):
    """On a slow machine chunks arrive faster than the engine works: the ones waiting are fed in
    one call and previewed once, not one preview per chunk."""
    from PySide6.QtCore import QObject, QTimer, Signal

    from dictation.app.options import engine_options

    class Driver(QObject):
        load = Signal(object)
        begin = Signal(int, object, str, bool)
        feed = Signal(int, int, object)

    streams: list[SpyStream] = []
    worker = workers.EngineWorker(spy_engine(streams))
    driver = Driver()
    driver.load.connect(worker.load)
    driver.begin.connect(worker.begin_take)
    driver.feed.connect(worker.feed)
    thread = workers.start_thread(worker, "engine")
    try:
        settings = Settings()
        settings = settings.replace(engine=settings.engine.replace(model=str(ckpt_untied), device="cpu"))
        with qtbot.waitSignal(worker.loaded, timeout=20_000):
            driver.load.emit(engine_options(settings))
        busy, gate = threading.Event(), threading.Event()
        QTimer.singleShot(0, worker, lambda: (busy.set(), gate.wait(20)))  # the engine thread is busy
        assert busy.wait(10)
        audio = take_audio(3.0)
        driver.begin.emit(1, None, "", True)
        chunks = np.array_split(audio, 6)
        start = 0
        for chunk in chunks:
            driver.feed.emit(1, start, chunk)
            start += len(chunk)
        gate.set()
        qtbot.waitUntil(lambda: bool(streams) and len(streams[0].previews) == 1, timeout=20_000)
        assert len(streams[0].fed) == 1
        np.testing.assert_array_equal(streams[0].fed[0], audio)
        driver.feed.emit(1, start + 5, audio[:100])  # a gap: streaming stops, the take goes the plain way
        qtbot.waitUntil(lambda: streams[0].cancelled, timeout=10_000)
    finally:
        workers.stop_thread(thread)


@pytest.mark.parametrize("refuse_16k", [False, True])
def test_the_audio_worker_hands_a_real_recorders_take_on_while_it_records(qtbot, tmp_path, refuse_16k):
    """The real Recorder (over a fake sound layer): at 16 kHz the chunks handed on during the take
    join up to the saved take's samples; a device that refuses 16 kHz is not streamed."""
    from PySide6.QtCore import QObject, Signal

    from dictation.audio.capture import Recorder
    from dictation.audio.devices import InputDevice
    from tests.audio.fakes import FakeBackend, FakeClock

    class Driver(QObject):
        configure = Signal(object)
        start = Signal(int, float, bool)
        stop = Signal(int, float, bool)

    clock = FakeClock()
    backend = FakeBackend([InputDevice(0, "Fake Mic", 48_000, 1, True)], clock=clock)
    backend.refuse_rates = {16_000} if refuse_16k else set()
    recorder = Recorder(backend=backend, clock=clock, post_roll_s=0.0)
    worker = workers.AudioWorker(lambda config: recorder, recordings_dir=tmp_path)
    chunks: list[tuple[int, int, np.ndarray]] = []
    worker.chunk_ready.connect(lambda take_id, start, samples: chunks.append((take_id, start, samples)))
    driver = Driver()
    driver.configure.connect(worker.configure)
    driver.start.connect(worker.start)
    driver.stop.connect(worker.stop)
    thread = workers.start_thread(worker, "audio")
    try:
        with qtbot.waitSignal(worker.opened, timeout=5000):
            driver.configure.emit(workers.RecorderConfig(device=None, max_seconds=60.0, keep_open=True))
        rate = 48_000 if refuse_16k else SR
        block = rate // 50
        noise = (np.random.default_rng(1).standard_normal(3 * rate) * 0.1).astype(np.float32)
        with qtbot.waitSignal(worker.started, timeout=5000):
            driver.start.emit(7, clock(), True)
        for a in range(0, len(noise), block):
            backend.stream.push(noise[a : a + block])
            if a in (rate, 2 * rate) and not refuse_16k:  # the worker hands on what came so far
                qtbot.waitUntil(lambda n=a: sum(len(c) for _, _, c in chunks) >= n, timeout=5000)
        with qtbot.waitSignal(worker.saved, timeout=5000) as saved_signal:
            driver.stop.emit(7, clock(), False)
        take_id, saved = saved_signal.args
        if refuse_16k:
            assert chunks == [] and not saved.streamed
            return
        assert saved.streamed and take_id == 7 and len(chunks) >= 2
        assert [start for _, start, _ in chunks] == list(np.cumsum([0] + [len(c) for _, _, c in chunks])[:-1])
        streamed = np.concatenate([c for _, _, c in chunks])
        np.testing.assert_array_equal(streamed, saved.samples[: len(streamed)])
    finally:
        workers.stop_thread(thread)
