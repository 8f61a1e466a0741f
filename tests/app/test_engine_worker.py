"""`EngineWorker`'s takes: the saved take comes from the audio worker, the go from the controller;
whichever comes second starts the transcription (a fake engine, the slots called on this thread)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import logging
import shutil
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dictation.app.engine_worker import EngineWorker
from dictation.session import Status
from dictation.takes import Retranscription, SavedTake
from tests.app.rig import speech

SR = 16_000


@dataclass(frozen=True)
class Options:
    model: str = "fake"
    device: str = "cpu"
    adapters: tuple = ()


class FakeEngine:
    def __init__(self, options) -> None:
        self.options = options
        self.is_loaded = False
        self.model_label = "fake · cpu"
        self.calls: list[tuple[np.ndarray, str | None, str]] = []
        self.texts: dict[int, str | Exception] = {}  # by number of samples: another text, or a failure
        self.streams: list[FakeStream] = []

    def prepare(self) -> None:
        self.is_loaded = True

    def unload(self) -> None:
        self.is_loaded = False

    def transcribe(self, samples, language=None, context=""):
        self.calls.append((samples, language, context))
        text = self.texts.get(len(samples), f"{len(samples)} samples")
        if isinstance(text, Exception):
            raise text
        return SimpleNamespace(text=text, language="English", timings={})

    def stream(self, *, language=None, context=""):
        self.streams.append(FakeStream(self))
        return self.streams[-1]


class FakeStream:
    """Streams like the engine: what it was fed, finished at ``end``, is transcribed."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine, self.fed, self.cancelled = engine, [], False

    def feed(self, samples) -> None:
        self.fed.append(samples)

    def finish(self, draft_ids=None, *, end=None):
        return self.engine.transcribe(np.concatenate(self.fed)[:end])

    def cancel(self) -> None:
        self.cancelled = True


@pytest.fixture
def worker(qapp):
    engines: list[FakeEngine] = []
    worker = EngineWorker(lambda options: engines.append(FakeEngine(options)) or engines[-1])
    worker.load(Options())
    worker.engine = engines[0]
    worker.answers = []
    worker.transcribed.connect(lambda key, result: worker.answers.append(("transcribed", key, result.text)))
    worker.transcribe_failed.connect(lambda key, message: worker.answers.append(("failed", key, message)))
    worker.no_speech.connect(lambda take_id: worker.answers.append(("no_speech", take_id)))
    return worker


def saved(start: int = 100, end: int = 900, silence: str | None = None) -> SavedTake:
    samples = np.linspace(-0.5, 0.5, 1000, dtype=np.float32)
    return SavedTake(None, samples, start, end, 1000 / SR, silence, None)


def test_build_and_load_builds_the_options_on_the_engine_thread_then_loads_them(qapp, qtbot):
    """What the controller sends: the options are built where the worker runs (building them imports
    torch), not on the GUI thread that sent them; `load` takes built options."""
    from PySide6.QtCore import QObject, Signal

    from dictation.app import workers

    class Driver(QObject):
        build_and_load = Signal(object)

    engines: list[FakeEngine] = []
    worker = EngineWorker(lambda options: engines.append(FakeEngine(options)) or engines[-1])
    built_on: list[threading.Thread] = []

    def build() -> Options:
        built_on.append(threading.current_thread())
        return Options(model="built")

    driver = Driver()
    driver.build_and_load.connect(worker.build_and_load)
    thread = workers.start_thread(worker, "engine")
    try:
        with qtbot.waitSignal(worker.loaded, timeout=5000):
            driver.build_and_load.emit(build)
    finally:
        workers.stop_thread(thread)
    assert len(built_on) == 1 and built_on[0] is not threading.main_thread()
    assert [engine.options for engine in engines] == [Options(model="built")]


@pytest.mark.parametrize("saved_first", [True, False])
def test_a_take_is_transcribed_when_both_its_samples_and_the_go_are_there(worker, saved_first):
    take = saved()
    steps = [lambda: worker.take_saved(1, take), lambda: worker.transcribe_take(1, "German", "names")]
    steps[0 if saved_first else 1]()
    assert worker.answers == []
    steps[1 if saved_first else 0]()
    assert worker.answers == [("transcribed", 1, "800 samples")]
    [(samples, language, context)] = worker.engine.calls
    np.testing.assert_array_equal(samples, take.speech)  # trimmed as the audio worker said
    assert (language, context) == ("German", "names")
    worker.transcribe_take(1, "German", "names")  # once only: the take is gone from the worker
    assert len(worker.engine.calls) == 1


@pytest.mark.parametrize("take", [saved(0, 0), saved(silence="the microphone delivered only zeros")])
def test_a_take_without_speech_is_answered_without_the_engine(worker, take):
    worker.take_saved(3, take)
    worker.transcribe_take(3, None, "")
    assert worker.answers == [("no_speech", 3)] and worker.engine.calls == []


@pytest.mark.parametrize("whole", ["1000 samples", "", RuntimeError("out of memory")])
def test_a_trimmed_take_without_words_is_transcribed_once_more_whole(worker, whole, caplog):
    """The trim found speech but the model found no words in it: the whole recording gets a second
    pass (its text wins if it has any); nothing more, and a failing second pass is not a failure."""
    worker.engine.texts = {800: "", 1000: whole}
    take = saved()
    with caplog.at_level(logging.INFO, logger="dictation.app.engine_worker"):
        worker.take_saved(1, take)
        worker.transcribe_take(1, None, "")
    assert [len(samples) for samples, _, _ in worker.engine.calls] == [800, 1000]
    np.testing.assert_array_equal(worker.engine.calls[1][0], take.samples)
    assert worker.answers == [("transcribed", 1, whole if isinstance(whole, str) else "")]
    assert "take 1: no words in its speech; transcribing the whole recording once more" in caplog.text


def test_an_untrimmed_take_without_words_is_not_transcribed_twice(worker):
    worker.engine.texts = {1000: ""}
    worker.take_saved(1, saved(0, 1000))
    worker.transcribe_take(1, None, "")
    assert len(worker.engine.calls) == 1 and worker.answers == [("transcribed", 1, "")]


def test_a_streamed_take_without_words_is_transcribed_once_more_whole(worker):
    """The stream's text (the take up to its trailing silence) is empty: the whole take is
    transcribed, not the stream again."""
    worker.engine.texts = {900: ""}
    take = replace(saved(0, 900), streamed=True)
    worker.begin_take(1, None, "", False)
    worker.feed(1, 0, take.samples[:600])
    worker.feed(1, 600, take.samples[600:])
    worker.take_saved(1, take)
    worker.transcribe_take(1, None, "")
    [stream] = worker.engine.streams
    assert [len(samples) for samples, _, _ in worker.engine.calls] == [900, 1000]  # finish(end=900), then whole
    assert worker.answers == [("transcribed", 1, "1000 samples")] and not stream.cancelled


def test_a_dropped_take_is_forgotten(worker):
    worker.take_saved(2, saved())
    worker.cancel_take(2)  # skipped: the model failed while it was recorded
    worker.transcribe_take(2, None, "")
    assert worker.answers == [] and worker.engine.calls == []


def test_a_history_request_is_answered_with_the_request_itself(worker):
    request = Retranscription(5, streamed=True)
    worker.transcribe(request, np.zeros(10, np.float32), None, "")
    assert worker.answers == [("transcribed", request, "10 samples")]


def test_the_saved_take_reaches_the_engine_while_the_gui_thread_is_busy(rig, ckpt_untied):
    """One hop: the audio worker hands the saved take to the engine worker itself; the GUI thread
    (blocked here after the release) is not on the way."""
    from dictation.asr import AsrEngine
    from dictation.config import Settings

    reached = threading.Event()

    class Watched(AsrEngine):
        def transcribe(self, samples, *args, **kwargs):
            reached.set()
            return super().transcribe(samples, *args, **kwargs)

    settings = Settings()
    settings = settings.replace(  # not streamed: the saved take is transcribed whole
        engine=settings.engine.replace(model=str(ckpt_untied), device="cpu", stream_while_recording=False)
    )
    r = rig(settings, engine_factory=Watched)
    r.start()
    r.wait_status(Status.IDLE)
    audio = speech()
    r.hold(audio)
    r.qtbot.waitUntil(lambda: r.c.takes.get(1) is not None and r.c.takes.get(1).entry_ready, timeout=5000)
    blocked: list[bool] = []

    def block_the_gui_thread(status: Status) -> None:
        # The release's actions ran (the audio worker was told to stop, the engine worker to
        # transcribe the take): now the GUI thread handles nothing until the engine has the take.
        if status is not Status.RECORDING and not blocked:
            blocked.append(reached.wait(15))

    r.c.status_changed.connect(block_the_gui_thread)
    r.release(audio)
    r.qtbot.waitUntil(lambda: bool(blocked), timeout=20_000)
    assert blocked == [True]
    r.qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)


# ---- failures: one line for what users meet, a traceback for bugs --------------------------------


def _failure_records(caplog) -> list:
    return [r for r in caplog.records if r.name == "dictation.app.engine_worker"]


def _broken_model(kind: str, ckpt: Path, tmp_path: Path) -> Path:
    folder = tmp_path / kind
    if kind == "truncated":
        shutil.copytree(ckpt, folder)
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # an interrupted download
    return folder


@pytest.mark.parametrize("kind", ["missing", "truncated"])
def test_a_model_that_cannot_load_is_one_line_with_its_traceback_at_debug_level(
    qapp, caplog, ckpt_untied, tmp_path, kind
):
    from dictation.asr import EngineOptions

    folder = _broken_model(kind, ckpt_untied, tmp_path)
    worker = EngineWorker()  # the real AsrEngine
    failed: list[str] = []
    worker.load_failed.connect(lambda message, gpu: failed.append(message))
    with caplog.at_level(logging.DEBUG, logger="dictation.app.engine_worker"):
        worker.load(EngineOptions(model=str(folder), device="cpu"))
    expected = {"missing": f"{folder}: no such model folder", "truncated": f"{folder / 'model.safetensors'}: truncated"}
    assert len(failed) == 1 and failed[0].startswith(expected[kind])
    warnings = [r for r in _failure_records(caplog) if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == [f"loading {folder} failed: {failed[0]}"]
    assert warnings[0].exc_info is None and "\n" not in warnings[0].getMessage()
    [debug] = [r for r in _failure_records(caplog) if r.levelno == logging.DEBUG]
    assert debug.exc_info is not None  # the traceback, for `dictation -v` at debug level


def test_a_take_while_the_model_is_unavailable_is_one_line(worker, caplog):
    from dictation.asr import ModelError

    def unavailable(samples, language=None, context=""):
        raise ModelError("/models/gone: no such model folder")

    worker.engine.transcribe = unavailable
    with caplog.at_level(logging.INFO, logger="dictation.app.engine_worker"):
        worker.take_saved(1, saved())
        worker.transcribe_take(1, None, "")
    assert worker.answers == [("failed", 1, "/models/gone: no such model folder")]
    [record] = _failure_records(caplog)
    assert record.getMessage() == "transcription 1 failed: /models/gone: no such model folder"
    assert record.exc_info is None


def test_an_unexpected_error_keeps_its_traceback(worker, caplog):
    def bug(samples, language=None, context=""):
        raise KeyError("a bug in the engine")

    worker.engine.transcribe = bug
    with caplog.at_level(logging.INFO, logger="dictation.app.engine_worker"):
        worker.transcribe(2, np.zeros(10, np.float32), None, "")
    assert worker.answers == [("failed", 2, "'a bug in the engine'")]
    [record] = _failure_records(caplog)
    assert record.getMessage() == "transcription 2 failed" and record.exc_info[0] is KeyError
