"""`WorkerPort`: the one way from the GUI thread to the workers, and from the workers back.

Every worker (engine, audio, output, history, download) lives on a QThread of its own. A call of a
worker's method from the GUI thread (`dictation.takes.Takes`, the controller) goes through the
port: ``port.history.store_text(take_id, fields)`` runs ``HistoryWorker.store_text(take_id, fields)``
on the history thread, after every call queued there before it (Qt's queued semantics: one event
queue per thread, in the order the calls were made). What each side may call is typed: a Protocol
per worker, those `Takes` needs in `dictation.takes` (Qt-free), the controller's additions here.

The mechanism is one small class, `ThreadCalls`: a QObject with one queued signal carrying a call
(a callable with its arguments), whose slot runs it on the thread the object lives on. Each worker
gets one as its child, so it moves to the worker's thread with it (`workers.start_thread`); the GUI
thread has one too (`WorkerPort.gui`), through which a worker's result signal reaches `Takes` and
the controller's collaborators: `gui.route(worker.signal, takes.method)` calls the method on the
GUI thread with the signal's arguments. (PySide6 runs a signal's plain Python receiver on the
emitting thread, hence the hop.) Routes hold their receivers strongly, so `WorkerPort.stop`
(at shutdown) disconnects them: nothing then keeps the controller alive. The port also starts and
stops the workers' threads (`start`, `stop`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt, QThread, Signal, Slot

from dictation.app.workers import start_thread, stop_thread, stop_threads
from dictation.takes import TakeEngine, TakeHistory, TakeOutput

P = TypeVar("P")


class ThreadCalls(QObject):
    """Calls queued onto the thread this object lives on, run there in the order they were made."""

    _queued = Signal(object)  # a callable without arguments
    _blocking = Signal(object)  # likewise; the caller waits until it ran (never from its own thread)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._queued.connect(self._run, Qt.ConnectionType.QueuedConnection)
        self._blocking.connect(self._run, Qt.ConnectionType.BlockingQueuedConnection)
        self._routes: list[tuple[Any, Callable[..., None]]] = []

    @Slot(object)
    def _run(self, call: Callable[[], Any]) -> None:
        call()

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on this object's thread, after the calls queued before it."""
        self._queued.emit(functools.partial(fn, *args))

    def call_blocking(self, fn: Callable[..., Any], *args: Any) -> None:
        """Like `call`, and return once it ran (Qt's BlockingQueuedConnection)."""
        self._blocking.emit(functools.partial(fn, *args))

    def route(self, signal: Any, fn: Callable[..., Any]) -> None:
        """Every emission of ``signal`` (from any thread) becomes ``call(fn, *its arguments)``."""
        forward = functools.partial(self.call, fn)
        signal.connect(forward)
        self._routes.append((signal, forward))

    def unroute(self) -> None:
        for signal, forward in self._routes:
            signal.disconnect(forward)
        self._routes.clear()


def protocol_names(protocol: type) -> frozenset[str]:
    """The methods a Protocol (and the Protocols it extends) lists."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (object, Protocol) or not getattr(cls, "_is_protocol", False):
            continue
        names.update(n for n, v in vars(cls).items() if not n.startswith("_") and callable(v))
    return frozenset(names)


class Queued:
    """The methods of ``worker`` that ``protocol`` lists, each call queued onto the worker's thread
    (those named in ``blocking`` wait until they ran). Anything else is refused: the Protocol is
    the whole of what the GUI thread may ask of that worker."""

    def __init__(self, worker: Any, protocol: type, calls: ThreadCalls, blocking: frozenset[str] = frozenset()) -> None:
        names = protocol_names(protocol)
        missing = sorted(n for n in names if not callable(getattr(worker, n, None)))
        if missing:
            raise TypeError(f"{type(worker).__name__} lacks {', '.join(missing)} of {protocol.__name__}")
        self._worker, self._names, self._calls, self._blocking = worker, names, calls, blocking
        self._protocol = protocol.__name__

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("_") or name not in self._names:
            raise AttributeError(f"{name} is not in {self._protocol}")
        method = getattr(self._worker, name)
        queue = self._calls.call_blocking if name in self._blocking else self._calls.call
        return functools.partial(queue, method)


def queued(worker: QObject, protocol: type[P], blocking: frozenset[str] = frozenset()) -> P:
    """``worker`` as ``protocol``, its calls queued onto its thread through a `ThreadCalls` child
    (made before the worker moves to its thread, so it moves along)."""
    return cast(P, Queued(worker, protocol, ThreadCalls(worker), blocking))


# ---- what the controller asks of each worker, besides what `Takes` asks ----------------------------


class EngineCalls(TakeEngine, Protocol):
    """`dictation.app.engine_worker.EngineWorker`."""

    def build_and_load(self, build_options: Callable[[], Any]) -> None: ...
    def unload(self) -> None: ...
    def begin_take(self, take_id: int, language: str | None, context: str, preview: bool) -> None: ...
    def warm_up(self) -> None: ...


class AudioCalls(Protocol):
    """`dictation.app.workers.AudioWorker`."""

    def configure(self, config: Any) -> None: ...  # a RecorderConfig
    def start(self, take_id: int, t_press: float, stream: bool) -> None: ...
    def stop(self, take_id: int, t_release: float, trim: bool) -> None: ...
    def cancel(self, take_id: int) -> None: ...  # the take's file goes
    def close(self) -> None: ...


class OutputCalls(TakeOutput, Protocol):
    """`dictation.app.workers.OutputWorker`."""

    def configure(self, options: Any) -> None: ...  # OutputOptions
    def flush(self) -> None: ...  # a pending clipboard restore, now


class HistoryCalls(TakeHistory, Protocol):
    """`dictation.app.history_worker.HistoryWorker`; `drain` and `close` return once done."""

    def open(self) -> None: ...
    def delete_entry(self, entry_id: int) -> None: ...
    def correct_entry(self, entry_id: int, text: str) -> None: ...
    def set_max_entries(self, value: int) -> None: ...
    def drain(self) -> None: ...  # everything queued before it is done
    def close(self) -> None: ...


class DownloadCalls(Protocol):
    """`dictation.app.workers.DownloadWorker`."""

    def run(self, repo_id: str) -> None: ...


class WorkerPort:
    """The workers as the GUI thread calls them (`dictation.takes.TakeWorkers`, and more), their
    threads, and `gui`: the GUI thread's `ThreadCalls`, which brings the workers' results back."""

    def __init__(self, engine: QObject, audio: QObject, output: QObject, history: QObject, download: QObject) -> None:
        self._workers = {"engine": engine, "audio": audio, "output": output, "history": history, "download": download}
        self.engine = queued(engine, EngineCalls)
        self.audio = queued(audio, AudioCalls)
        self.output = queued(output, OutputCalls)
        self.history = queued(history, HistoryCalls, blocking=frozenset({"drain", "close"}))
        self.download = queued(download, DownloadCalls)
        self.gui = ThreadCalls()
        self._threads: dict[str, QThread] = {}

    def start(self, *names: str) -> None:
        """Start these workers' threads (each worker, with its `ThreadCalls`, moves to its own)."""
        for name in names:
            self._threads[name] = start_thread(self._workers[name], name)

    def stop(self, also_flush: QObject) -> list[QThread]:
        """Quitting: the output's pending clipboard put back, the microphone closed, the threads
        stopped (the engine's waited for briefly: `workers.stop_threads`); the results they queued
        for the GUI thread are handled now (with ``also_flush``'s queued calls), and what that asks
        of the history worker is done before it stops: it drains its queue, answers, then closes its
        connection (both calls wait until the history thread ran them). Then the routes back to the
        GUI thread go: nothing keeps their receivers alive. Returns the threads left running."""

        def handle_results() -> None:
            for receiver in (self.gui, also_flush):
                QCoreApplication.sendPostedEvents(receiver, QEvent.Type.MetaCall)

        self.output.flush()
        self.audio.close()
        history = self._threads.pop("history", None)
        left = stop_threads(list(self._threads.values()), self._workers["engine"])
        self._threads.clear()
        handle_results()
        if history is not None:
            self.history.drain()
            handle_results()
            self.history.close()
            stop_thread(history)
            handle_results()
        self.gui.unroute()
        return left
