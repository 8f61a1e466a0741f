"""Python's cycle collector runs in whichever thread happens to allocate when a threshold is crossed.
A Qt object caught in a reference cycle (a closed window whose slots refer back to it) is then
destroyed in that thread: on the engine thread while it builds a model, Qt frees a widget outside
the GUI thread and the process dies with a segmentation fault (it did, in CI, at 7 % of the tests).

So while the app's worker threads run, automatic collection is off and the GUI thread collects
instead, every `INTERVAL_MS`, the generation whose threshold Python would have crossed. Garbage
without cycles is freed at once by reference counting as always; only cycles wait, at most that
long. `workers.start_thread` holds the collector and `workers.stop_thread` / `stop_threads` let it
go; with the last worker thread gone, Python collects by itself again (docs/app.md, "Threads").
"""

from __future__ import annotations

import gc
import threading

from PySide6.QtCore import QCoreApplication, QTimer

INTERVAL_MS = 500

_holders = 0
_timer: QTimer | None = None
_was_enabled = True


def hold() -> None:
    """One more worker thread: from the first, collection happens on the GUI thread only. Called on
    the GUI thread, the main one (it owns the timer); elsewhere, or without a Qt application,
    nothing changes."""
    global _holders, _timer, _was_enabled
    app = QCoreApplication.instance()
    if app is None or threading.current_thread() is not threading.main_thread():
        return
    _holders += 1
    if _holders > 1:
        return
    _was_enabled = gc.isenabled()
    gc.disable()
    _timer = QTimer(app)
    _timer.setObjectName("gui-gc")
    _timer.setInterval(INTERVAL_MS)
    _timer.timeout.connect(collect_due)
    _timer.start()


def release() -> None:
    """One worker thread fewer (stopped, or left running while the app quits); with none left,
    collection is Python's own again."""
    global _holders, _timer
    if _holders == 0 or threading.current_thread() is not threading.main_thread():
        return
    _holders -= 1
    if _holders > 0:
        return
    if _timer is not None:
        _timer.stop()
        _timer.deleteLater()
        _timer = None
    if _was_enabled:  # no collection here: quitting stays quick (a full one takes up to a second)
        gc.enable()


def active() -> bool:
    """True while collection is kept to the GUI thread."""
    return _holders > 0


def collect_due() -> int:
    """Collect the generation Python would have collected by now (its thresholds against the
    counts since the last collection); the number of objects found unreachable."""
    counts, limits = gc.get_count(), gc.get_threshold()
    if counts[0] <= limits[0]:
        return 0
    generation = 0
    if counts[1] > limits[1]:
        generation = 1
        if counts[2] > limits[2]:
            generation = 2
    return gc.collect(generation)
