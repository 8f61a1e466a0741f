"""Cycles holding Qt objects are collected on the GUI thread while the app's worker threads run
(dictation/app/gui_gc.py): a window collected on the engine thread crashed the process in CI."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
from PySide6.QtCore import QObject
from PySide6.QtWidgets import QWidget

from dictation.app import gui_gc
from dictation.app.workers import start_thread, stop_thread, stop_threads
from dictation.asr import AsrEngine, EngineOptions

pytestmark = pytest.mark.own_gc  # these tests start from Python's own collection


class Idle(QObject):
    def close(self) -> None:
        """stop_threads closes the engine's worker once its thread stopped (EngineWorker.close)."""


def _cyclic_garbage(make=QObject) -> list[int]:
    """A Qt object kept only by a cycle through itself, then dropped; the list gets the ident of
    the thread that frees it."""
    freed_on: list[int] = []
    obj = make()
    obj.me = obj  # the cycle: only the collector frees it
    weakref.finalize(obj, lambda: freed_on.append(threading.get_ident()))
    del obj
    return freed_on


def _allocate_in_a_thread(work) -> None:
    thread = threading.Thread(target=work, name="busy-worker")
    thread.start()
    thread.join()


KEPT: list = []


def _churn() -> None:
    """What building a model does: many new container objects, well past every threshold (kept
    alive, as a model's are, until the test ends)."""
    KEPT.append([[i] for i in range(50_000)])


def test_a_cycle_dropped_on_the_gui_thread_is_freed_there_not_on_the_busy_worker(qtbot):
    thread = start_thread(Idle(), "engine")
    try:
        assert gui_gc.active() and not gc.isenabled()
        freed_on = _cyclic_garbage(QWidget)
        _allocate_in_a_thread(_churn)
        assert freed_on == []  # the worker's allocations collected nothing
        qtbot.waitUntil(lambda: freed_on != [], timeout=5 * gui_gc.INTERVAL_MS)
        assert freed_on == [threading.get_ident()]
    finally:
        stop_thread(thread)
        KEPT.clear()
    assert not gui_gc.active() and gc.isenabled()


def test_the_engines_unload_on_its_thread_leaves_the_cycles_to_the_gui_thread(qtbot):
    """Unloading (the idle unload runs on the engine thread) collected there explicitly."""
    thread = start_thread(Idle(), "engine")
    try:
        freed_on = _cyclic_garbage()
        _allocate_in_a_thread(AsrEngine(EngineOptions(model="not-loaded", device="cpu")).unload)
        assert freed_on == []
        _churn()  # on the GUI thread now: its timer collects once the counts are past the threshold
        qtbot.waitUntil(lambda: freed_on != [], timeout=5 * gui_gc.INTERVAL_MS)
        assert freed_on == [threading.get_ident()]
    finally:
        stop_thread(thread)
        KEPT.clear()


def test_python_collects_by_itself_again_once_every_worker_thread_stopped(qtbot):
    threads = [start_thread(Idle(), name) for name in ("audio", "engine", "output")]
    stop_thread(threads[0])
    assert gui_gc.active() and not gc.isenabled()  # two still run
    stop_threads(threads[1:], Idle())
    assert not gui_gc.active() and gc.isenabled()
    freed_on = _cyclic_garbage()
    _allocate_in_a_thread(_churn)  # with no app threads left, any thread may collect again
    KEPT.clear()
    assert freed_on != [] and freed_on != [threading.get_ident()]


def test_a_thread_started_off_the_gui_thread_changes_nothing(qtbot):
    started: list = []
    _allocate_in_a_thread(lambda: started.append(gui_gc.active() or (gui_gc.hold(), gui_gc.active())[1]))
    assert started == [False] and gc.isenabled()


def test_the_due_generation_is_the_one_python_would_collect(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(gc, "get_threshold", lambda: (700, 10, 10))
    monkeypatch.setattr(gc, "collect", lambda generation=2: calls.append(generation) or 0)
    for counts, expected in [((10, 0, 0), []), ((701, 3, 0), [0]), ((701, 11, 3), [1]), ((701, 11, 11), [2])]:
        calls.clear()
        monkeypatch.setattr(gc, "get_count", lambda counts=counts: counts)
        gui_gc.collect_due()
        assert calls == expected, counts
