"""A fatal signal leaves Python's stacks in the log folder's crash.log (dictation/app/logs.py)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CRASH = textwrap.dedent(
    """
    import ctypes, sys
    from pathlib import Path
    from dictation.app.logs import record_crashes

    def transcribe_the_take():
        ctypes.string_at(0)  # reads address 0: SIGSEGV

    print(record_crashes(Path(sys.argv[1])), flush=True)
    transcribe_the_take()
    """
)


def crash(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CRASH, str(folder)], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_a_segfault_writes_every_threads_stack_to_a_private_crash_file(tmp_path):
    folder = tmp_path / "log"
    proc = crash(folder)
    assert proc.returncode == -signal.SIGSEGV, proc.stderr
    path = folder / "crash.log"
    assert proc.stdout.strip() == str(path)
    text = path.read_text()
    assert "Segmentation fault" in text and "transcribe_the_take" in text, text
    assert path.stat().st_mode & 0o777 == 0o600 and folder.stat().st_mode & 0o777 == 0o700
    assert "Segmentation fault" not in proc.stderr  # the stacks go to the file, not to a terminal nobody sees


def test_the_next_start_keeps_the_previous_crash_and_says_where(tmp_path, caplog):
    from dictation.app.logs import record_crashes

    folder = tmp_path / "log"
    crash(folder)
    before = (folder / "crash.log").read_text()
    with caplog.at_level(logging.WARNING):
        assert record_crashes(folder) == folder / "crash.log"
    try:
        assert (folder / "crash-previous.log").read_text() == before
        assert (folder / "crash.log").read_text() == ""
        assert str(folder / "crash-previous.log") in caplog.text and "crashed" in caplog.text
        assert record_crashes(folder) is not None and not caplog.text.count("crashed") > 1  # an empty file: no word
    finally:
        import faulthandler

        faulthandler.disable()  # the test process's own handler: pytest's, as it was
        faulthandler.enable(file=sys.__stderr__)


def test_a_folder_that_cannot_be_written_leaves_the_app_running_without_it(tmp_path, caplog):
    from dictation.app.logs import record_crashes

    blocked = tmp_path / "file"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING):
        assert record_crashes(blocked / "log") is None
    assert "no crash file" in caplog.text
