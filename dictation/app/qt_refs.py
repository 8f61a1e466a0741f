"""None, True and False kept alive on Python 3.10 and 3.11 against a PySide6 that drops references to them.

PySide6-Essentials 6.12.0 (with its shiboken6) returns None from every Qt call that returns nothing
(`processEvents()`, `setObjectName()`, `QTimer.stop()`, ...) or returns a null object (`parent()`
without a parent), and True from `Signal.emit()`, without the new reference the caller will give
back: each such call leaves one reference fewer. (Likely built against CPython headers whose
`Py_RETURN_NONE` / `Py_RETURN_TRUE` skip the reference even for the stable ABI of older Pythons.)
On Python 3.12 and later None, True and False are immortal and nothing happens. On 3.10 and 3.11 the
count reaches zero and the interpreter aborts: "Fatal Python error: none_dealloc: deallocating
None" or "bool_dealloc: deallocating True or False"; a bare script does after 5,000 calls.
The app holds about 100,000 references to None and 17,000 to True and loses none while idle (Qt
calling Python slots is not affected), but per take at least 90 of each, and 13 to True a second
while recording (the level's `emit` every 100 ms): it would abort after some 20 minutes of
recording. 6.11.0-6.11.3, 6.10.0, 6.10.3, 6.9.3, 6.8.3 and 6.5.3 count correctly; pyproject.toml
excludes 6.12.0 before Python 3.12, and this covers an environment that has it all the same (or a
later release with the same fault).

`guard` detects the fault (a few dozen such calls, the counts before and after) and then adds
2**40 references to each of the three objects, which is what 3.12's immortality amounts to: the
count can no longer reach zero. These objects are never freed anyway while the interpreter runs,
so nothing else changes. The count is written through ctypes: the first field of every object in
a release build of CPython (a build with Py_TRACE_REFS has two pointers first; it is left alone).
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

PIN = 1 << 40  # references added to None, True and False where the fault is found
PROBE_CALLS = 32  # each probe's calls (few: in a bare interpreter True has only some hundreds)

_pinned = False  # pinned once in this process: a later guard (another start in the same process) does nothing


def affected_python() -> bool:
    """The interpreter counts references to None, True and False (before 3.12's immortal objects)."""
    return sys.version_info < (3, 12)


def lost_references(calls: int = PROBE_CALLS) -> dict[str, int]:
    """References to None (a Qt call returning nothing) and to True (a signal's `emit`) that
    ``calls`` calls took and did not give back, measured on a fresh object of our own; 0 each with
    a correct binding. A thread running Python meanwhile can move the counts by a few."""
    from PySide6.QtCore import QObject, Signal

    class Probe(QObject):
        probed = Signal()

    probe = Probe()
    before = sys.getrefcount(None)
    for _ in range(calls):
        probe.setObjectName("qt-refs-probe")
    lost_none = before - sys.getrefcount(None)
    before = sys.getrefcount(True)
    for _ in range(calls):
        probe.probed.emit()
    lost_true = before - sys.getrefcount(True)
    return {"None": lost_none, "True": lost_true}


def pin() -> bool:
    """Add `PIN` references to None, True and False; False where this build's objects do not start
    with their count (a Py_TRACE_REFS build). The read and the write are two steps: a thread that
    takes or drops a few references between them moves the result by that few, out of 2**40."""
    if hasattr(sys, "getobjects"):  # Py_TRACE_REFS: the object starts with two list pointers
        return False
    for obj in (None, True, False):
        count = ctypes.c_ssize_t.from_address(id(obj))
        count.value += PIN
    return True


def guard() -> bool:
    """On Python before 3.12, with a PySide6 that loses references to None or True: pin them (and
    say so in the log). True when pinned, now or before. Called at the app's start, before its threads."""
    global _pinned
    if _pinned or not affected_python():
        return _pinned
    lost = lost_references()
    if max(lost.values()) < PROBE_CALLS // 2:
        return False
    import PySide6

    _pinned = pinned = pin()
    log.warning(
        "PySide6 %s on Python %d.%d loses a reference to None or True per Qt call (%s in %d calls); %s",
        PySide6.__version__,
        *sys.version_info[:2],
        ", ".join(f"{name} {count}" for name, count in lost.items()),
        PROBE_CALLS,
        "None, True and False are kept alive" if pinned else "this build cannot be helped: the app will abort",
    )
    return pinned
