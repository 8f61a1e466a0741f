"""The one way between the GUI thread and the workers (dictation/app/worker_port.py): calls queued onto
the worker's own thread in order, results routed back onto the GUI thread, and the controller has no
relay signals of its own."""

from __future__ import annotations

import threading
from typing import Protocol

import pytest
from PySide6.QtCore import QObject, QThread, Signal

from dictation.app.controller import AppController
from dictation.app.history_worker import HistoryWorker
from dictation.app.worker_port import Queued, ThreadCalls, queued
from dictation.app.workers import OutputWorker, start_thread, stop_thread
from dictation.takes import Takes
from tests.app.rig import speech


def thread_name() -> str:
    return "gui" if threading.current_thread() is threading.main_thread() else QThread.currentThread().objectName()


class Calls(Protocol):
    def note(self, value: int) -> None: ...
    def slow_note(self, value: int) -> None: ...


class Worker(QObject):
    said = Signal(int)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, str]] = []

    def note(self, value: int) -> None:
        self.seen.append((value, thread_name()))

    def slow_note(self, value: int) -> None:
        threading.Event().wait(0.05)
        self.note(value)

    def not_in_the_protocol(self) -> None:
        self.note(-1)

    def tell(self, value: int) -> None:  # called on its thread: emits from there
        self.said.emit(value)


@pytest.fixture
def worker(qtbot):
    w = Worker()
    port = queued(w, Calls, blocking=frozenset({"slow_note"}))  # its ThreadCalls moves with the worker
    thread = start_thread(w, "work")
    yield w, port
    stop_thread(thread)


def test_calls_run_on_the_workers_thread_in_the_order_they_were_made(worker, qtbot):
    w, port = worker
    for i in range(50):
        port.note(i)
    qtbot.waitUntil(lambda: len(w.seen) == 50, timeout=5000)
    assert w.seen == [(i, "work") for i in range(50)]


def test_a_blocking_call_has_run_when_it_returns_after_what_was_queued_before_it(worker):
    w, port = worker
    port.note(1)
    port.slow_note(2)  # waits on the worker's thread
    assert w.seen == [(1, "work"), (2, "work")]


def test_only_what_the_protocol_lists_can_be_called(worker):
    _, port = worker
    with pytest.raises(AttributeError, match="not_in_the_protocol is not in Calls"):
        port.not_in_the_protocol()


def test_a_worker_lacking_a_method_of_its_protocol_is_refused(qtbot):
    class Half(QObject):
        def note(self, value: int) -> None: ...

    with pytest.raises(TypeError, match="Half lacks slow_note of Calls"):
        Queued(Half(), Calls, ThreadCalls())


def test_a_routed_signal_reaches_a_plain_function_on_the_gui_thread_until_unrouted(worker, qtbot):
    w, _ = worker
    gui = ThreadCalls()
    heard: list[tuple[int, str]] = []
    gui.route(w.said, lambda value: heard.append((value, thread_name())))
    w.findChild(ThreadCalls).call(w.tell, 7)  # emitted on the worker's thread
    qtbot.waitUntil(lambda: heard == [(7, "gui")], timeout=5000)
    gui.unroute()
    w.said.emit(8)
    qtbot.wait(50)
    assert heard == [(7, "gui")]


def test_the_controller_has_no_relay_signals():
    private = [n for n, v in vars(AppController).items() if isinstance(v, Signal) and n.startswith("_")]
    assert private == []


def test_a_takes_calls_run_on_the_workers_threads_and_its_answers_on_the_gui_thread(rig, qtbot, monkeypatch):
    """History before typing, each on its worker's thread; `Takes` hears the answers on the GUI thread."""
    log: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    def spy(cls, name):
        original = getattr(cls, name)

        def wrapper(self, key, *args):
            with lock:
                log.append((f"{cls.__name__}.{name}", key, thread_name()))
            return original(self, key, *args)

        monkeypatch.setattr(cls, name, wrapper)

    spy(HistoryWorker, "begin_take")
    spy(HistoryWorker, "store_text")
    spy(OutputWorker, "type_text")
    spy(HistoryWorker, "finish_take")
    spy(Takes, "entry_ready")
    spy(Takes, "stored")
    spy(Takes, "delivered")
    r = rig()
    r.start()
    qtbot.waitUntil(lambda: r.c.model_ready, timeout=20_000)
    r.dictate(speech())
    qtbot.waitUntil(lambda: any(e[0] == "HistoryWorker.finish_take" for e in log), timeout=20_000)
    take_id = log[0][1]
    assert [e for e in log if e[1] == take_id] == [
        ("HistoryWorker.begin_take", take_id, "history"),
        ("Takes.entry_ready", take_id, "gui"),
        ("HistoryWorker.store_text", take_id, "history"),  # text goes to history before it is typed
        ("Takes.stored", take_id, "gui"),
        ("OutputWorker.type_text", take_id, "output"),
        ("Takes.delivered", take_id, "gui"),
        ("HistoryWorker.finish_take", take_id, "history"),
    ]
    assert len(r.chain.delivered) == 1
