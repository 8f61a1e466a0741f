"""A long-running app on Python 3.10/3.11 does not abort on a PySide6 that loses a reference to None or
True per Qt call (6.12.0): `qt_refs.guard`, as the app's start calls it, in a fresh interpreter that
then makes 200,000 such calls of each kind. Without the guard that process aborts ("none_dealloc" or
"bool_dealloc") after a few thousand."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from dictation.app import qt_refs

pytestmark = pytest.mark.skipif(
    not qt_refs.affected_python(),
    reason="Python 3.12+: None, True and False are immortal, no reference count to lose",
)

CALLS = 200_000

SCRIPT = textwrap.dedent(
    f"""
    import sys
    from PySide6.QtCore import QCoreApplication, QObject, Signal
    from dictation.app import qt_refs

    app = QCoreApplication([])
    pinned = qt_refs.guard() if "--unguarded" not in sys.argv else False  # --unguarded: as before the guard

    class Beacon(QObject):
        beat = Signal()

    beacon = Beacon()
    for _ in range({CALLS}):
        QCoreApplication.processEvents()  # returns nothing
        beacon.parent()  # returns None
        beacon.beat.emit()  # returns True
    print("pinned" if pinned else "not needed", flush=True)
    """
)


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=300)


def test_qt_calls_by_the_hundred_thousand_do_not_abort_the_interpreter():
    done = run(SCRIPT)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip() in ("pinned", "not needed")


def test_without_the_guard_a_faulty_binding_aborts_the_interpreter():
    """What the guard prevents, where this PySide6 has the fault; with a correct one the calls are harmless."""
    done = run(SCRIPT, "--unguarded")
    if done.returncode == 0:
        assert done.stdout.strip() == "not needed"
    else:
        assert done.returncode == -signal.SIGABRT, done.stderr[-2000:]
        assert "_dealloc: deallocating" in done.stderr


def test_a_faulty_binding_is_found_and_a_correct_one_left_alone():
    done = run(
        textwrap.dedent(
            """
            import sys
            from dictation.app import qt_refs
            lost = qt_refs.lost_references()
            faulty = max(lost.values()) >= qt_refs.PROBE_CALLS // 2
            pinned = qt_refs.guard()
            assert pinned == faulty, (lost, pinned)
            assert (sys.getrefcount(None) > qt_refs.PIN) == faulty
            assert (sys.getrefcount(True) > qt_refs.PIN) == faulty
            assert (sys.getrefcount(False) > qt_refs.PIN) == faulty
            assert qt_refs.guard() == pinned and sys.getrefcount(None) < 2 * qt_refs.PIN  # once a process
            print("faulty" if faulty else "correct", lost)
            """
        )
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"


def test_pinned_counts_survive_what_the_probe_takes():
    done = run(
        textwrap.dedent(
            """
            import sys
            from dictation.app import qt_refs
            before = [sys.getrefcount(o) for o in (None, True, False)]
            assert qt_refs.pin()
            after = [sys.getrefcount(o) for o in (None, True, False)]
            assert all(abs(a - b - qt_refs.PIN) < 16 for a, b in zip(after, before)), (before, after)
            """
        )
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
