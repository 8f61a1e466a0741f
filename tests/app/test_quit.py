"""Quitting while the engine is in a call that cannot be interrupted: the other
threads stop as before, the engine's is waited for `ENGINE_STOP_WAIT_MS` only and handed back to the
caller (main.py ends the process without it), and what the engine says after that is dropped.
Quitting frees the speech model, and nothing the controller wired keeps it alive afterwards (each
test that started the controller left its model behind: about 120 MB a test).
The whole app under SIGTERM and Quit: tests/e2e/test_crash_recovery_e2e.py."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import gc
import threading
import time
import weakref

from PySide6.QtCore import QCoreApplication, QObject, Signal, Slot

from dictation.app import workers
from dictation.app.workers import start_thread, stop_threads
from dictation.asr import AsrEngine
from dictation.config import Settings
from dictation.session import ModelState
from tests.app.rig import Rig, speech


class Busy(QObject):
    """A worker whose slot runs until ``release`` is set (a torch call that cannot be interrupted)."""

    done = Signal(str)
    go = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.inside = threading.Event()
        self.release = threading.Event()
        self.closed = False

    def close(self) -> None:  # as EngineWorker.close: called once its thread stopped
        self.closed = True

    @Slot()
    def work(self) -> None:
        self.inside.set()
        self.release.wait(30)
        self.done.emit("finished after the quit")


def test_a_busy_engine_is_left_behind_and_the_other_threads_stop(qtbot):
    engine, other = Busy(), Busy()
    engine.go.connect(engine.work)
    threads = [start_thread(other, "audio"), start_thread(engine, "engine"), start_thread(Busy(), "output")]
    heard: list[str] = []
    engine.done.connect(heard.append)
    engine.go.emit()
    assert engine.inside.wait(5)
    try:
        t0 = time.monotonic()
        left = stop_threads(threads, engine)
        elapsed = time.monotonic() - t0
        assert left == [threads[1]] and threads[1].isRunning()
        assert not threads[0].isRunning() and not threads[2].isRunning()
        assert workers.ENGINE_STOP_WAIT_MS / 1000 <= elapsed < 1.5  # not the 10 s it waited before
    finally:
        engine.release.set()
        assert threads[1].wait(10_000)
    QCoreApplication.sendPostedEvents()  # what the engine emitted before its thread ended, if anything
    assert heard == []  # dropped: its take is transcribed at the next start


def test_an_engine_that_finishes_in_time_is_not_left_behind(qtbot):
    engine = Busy()
    engine.release.set()
    thread = start_thread(engine, "engine")
    assert stop_threads([thread], engine) == []
    assert not thread.isRunning() and not engine.signalsBlocked() and engine.closed


def loaded(r: Rig, qtbot) -> None:
    r.start()
    qtbot.waitUntil(lambda: r.c.session.model_state is ModelState.READY, timeout=20_000)


def test_quitting_frees_the_speech_model_while_the_controller_is_still_held(rig, qtbot):
    """Something may hold the controller after its shutdown (a window, this test's rig): the model
    goes all the same once the engine's thread has stopped."""
    engines: list[weakref.ref] = []

    def factory(options):
        engine = AsrEngine(options)
        engines.append(weakref.ref(engine))
        return engine

    r = rig(engine_factory=factory)
    loaded(r, qtbot)
    r.close()
    gc.collect()
    assert len(engines) == 1 and engines[0]() is None


def test_a_controller_that_quit_is_freed_with_its_workers(qtbot, tmp_path, ckpt_untied):
    """No connection the controller made (to its workers, its personaliser) keeps it, its engine
    worker or the model alive once nothing else holds it."""
    settings = Settings()
    r = Rig(qtbot, tmp_path, settings.replace(engine=settings.engine.replace(model=str(ckpt_untied), device="cpu")))
    controller, worker, chain = weakref.ref(r.c), weakref.ref(r.engine_worker), r.chain
    try:
        loaded(r, qtbot)
        r.dictate(speech())  # a take schedules the session's ticks
        qtbot.waitUntil(lambda: len(chain.delivered) == 1, timeout=20_000)
    finally:
        r.close()
    del r
    gc.collect()
    assert controller() is None and worker() is None
