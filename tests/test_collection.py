"""Collecting the suite stays cheap: test modules leave heavy libraries to the tests that use them,
and pytest imports them with Python's automatic garbage collection paused (tests/conftest.py)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import collector_paused

TESTS = Path(__file__).parent

# Each takes from a few tenths of a second to seconds to import and only some tests need it: those
# tests (or their fixtures) import it, never a test module or conftest.py at its top.
HEAVY = [
    "transformers",
    "qwen_asr",
    "librosa",
    "scipy",
    "accelerate",
    "peft",
    "bitsandbytes",
    "triton",
    "numba",
    "sympy",
]

GC_ON_WHILE_IMPORTED = gc.isenabled()  # pytest imported this module while collecting the suite


def test_importing_every_test_module_and_conftest_loads_no_heavy_library():
    names = sorted(
        ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)
        for path in TESTS.rglob("*.py")
        if path.name.startswith("test_") or path.name == "conftest.py"
    )
    assert "tests.app.conftest" in names and "tests.asr.test_models" in names
    # tests.conftest first, as pytest does (it imports torch before anything imports PySide6)
    script = textwrap.dedent(f"""
        import gc, importlib, sys
        import pytest
        gc.disable()
        for name in ["tests.conftest"] + {names!r}:
            try:
                importlib.import_module(name)
            except pytest.skip.Exception:
                pass
        print(sorted(m for m in {HEAVY!r} if m in sys.modules))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "[]"


def test_test_modules_are_imported_with_the_collector_paused_and_run_with_it_on():
    assert GC_ON_WHILE_IMPORTED is False
    assert gc.isenabled()


class _Collected:
    """An object made while the suite was collected."""


MADE_AT_COLLECTION = _Collected()


def test_what_collection_left_alive_is_out_of_the_collectors_sight():
    """So that a full collection during the run (after every app test) does not walk the whole suite."""
    assert gc.get_freeze_count() > 10_000
    assert not any(o is MADE_AT_COLLECTION for o in gc.get_objects())
    made_now = _Collected()
    assert any(o is made_now for o in gc.get_objects())


def test_collector_paused_turns_collection_on_again_after_an_error():
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("inside")
    assert gc.isenabled()


def test_collector_paused_leaves_collection_off_where_it_was_off():
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
