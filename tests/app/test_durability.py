"""No dictation is lost: the recordings folder or the history failing,
the app quitting or crashing mid-take. The controller runs with a real engine, real files, a real
SQLite history and a real second process holding its lock; disk errors are injected as the OSError
the system would raise (the tests run as root, which ignores read-only permissions)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import errno
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QTimer

from dictation.app import history_worker
from dictation.audio.recordings import TakeFile
from dictation.audio.trim import find_speech
from dictation.audio.wav import load_audio_16k
from dictation.config import History, Outcome
from dictation.config.journal import Journal
from dictation.session import Status
from tests.app.controller_fakes import FakeChain
from tests.app.rig import speech


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(history_worker, "RETRY_MS", 200)


def _rows(db_path: Path) -> list[tuple]:
    """The history's rows as another reader sees them (read-only: no lock taken, no schema check)."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT id, text, outcome, audio_path FROM dictations ORDER BY id").fetchall()
    finally:
        conn.close()


class OrderChain(FakeChain):
    """Notes, at the moment typing starts (on the output thread), where the text already is."""

    def __init__(self, db_path: Path, journal_path: Path):
        super().__init__()
        self.db_path, self.journal_path = db_path, journal_path
        self.found_at_typing: list[tuple[bool, bool]] = []  # (in the database, in the journal)

    def deliver(self, text):
        in_db = any(row[1] == text for row in _rows(self.db_path))
        journal = Journal(self.journal_path)
        in_journal = any(r.fields.get("text") == text for r in journal.records())
        self.found_at_typing.append((in_db, in_journal))
        return super().deliver(text)


class GuiWatch:
    """The longest the GUI thread went without running a 10-ms timer (a blocked GUI shows here)."""

    def __init__(self):
        self.last = time.monotonic()
        self.longest = 0.0
        self.timer = QTimer()
        self.timer.timeout.connect(self._tick)
        self.timer.start(10)

    def _tick(self):
        now = time.monotonic()
        self.longest = max(self.longest, now - self.last)
        self.last = now


def _ordered_rig(rig, tmp_path, settings=None):
    chain = OrderChain(tmp_path / "history.sqlite3", tmp_path / "history-unsaved.jsonl")
    return rig(settings, chain=chain)


# ---- item 24: the entry exists before typing starts ------------------------------------------------


def test_the_text_is_in_the_history_before_typing_starts(rig, qtbot, tmp_path):
    r = _ordered_rig(rig, tmp_path)
    r.start()
    r.wait_status(Status.IDLE)
    r.dictate(speech())
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert r.chain.delivered[0].strip()
    assert r.chain.found_at_typing == [(True, False)]  # checked by the typing itself, not afterwards


# ---- item 1: the recordings folder cannot be written ------------------------------------------------


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_a_recordings_folder_that_cannot_be_written_still_types_and_keeps_the_text(
    rig, qtbot, tmp_path, monkeypatch, code
):
    folder = tmp_path / "recordings"
    folder.mkdir()
    real_open = os.open

    def refuse(path, *args, **kwargs):
        if str(path).startswith(str(folder)) and (code != errno.ENOSPC or ".tmp" in str(path)):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, *args, **kwargs)

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "open", refuse)
    if code == errno.ENOSPC:  # the take's file is made, then the disk is full: writes fail
        monkeypatch.setattr(os, "pwrite", full)
    r = _ordered_rig(rig, tmp_path)
    r.start()
    r.wait_status(Status.IDLE)
    r.dictate(speech(3.0))
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    r.wait_status(Status.IDLE)
    typed = r.chain.delivered[0]
    assert typed.strip()
    assert r.chain.found_at_typing == [(True, False)]
    qtbot.waitUntil(lambda: r.history.recent(1)[0].outcome == Outcome.PASTED, timeout=10_000)
    entry = r.history.recent(1)[0]
    assert entry.text == typed and entry.audio_path is None and r.history.count() == 1
    assert list(folder.iterdir()) == []  # no half-written file left behind
    notes = " ".join(m for _, m in r.notes)
    assert "The recording could not be saved" in notes and os.strerror(code) in notes
    assert "audio is not kept" in notes
    assert "was saved" not in notes


# ---- item 2: the history cannot be written -----------------------------------------------------------

_LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()  # held until the test closes our stdin
conn.execute("COMMIT")
"""


def test_a_history_locked_by_another_program_blocks_nothing_and_loses_nothing(rig, qtbot, tmp_path):
    r = _ordered_rig(rig, tmp_path)
    r.start()
    r.wait_status(Status.IDLE)
    db_path = tmp_path / "history.sqlite3"
    locker = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(db_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert locker.stdout.readline().strip() == "locked"
        watch = GuiWatch()
        audio = speech(3.0)
        r.hold(audio)
        t_release = time.monotonic()
        r.release(audio)
        qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=30_000)
        typed_after = time.monotonic() - t_release
        r.wait_status(Status.IDLE)
        watch.timer.stop()
        typed = r.chain.delivered[0]
        assert typed.strip()
        assert r.chain.found_at_typing == [(False, True)]  # in the journal, durably, before typing
        assert watch.longest < 2.0, f"the GUI thread was blocked for {watch.longest:.1f} s"
        assert typed_after < 10.0  # not held up by the lock (the old code waited 10 s, then lost it)
        assert not any(row[1] == typed for row in _rows(db_path))
        assert any(level == "warning" and "history cannot be written" in m for level, m in r.notes)
        r.dictate(speech(2.0, seed=8))  # the next one goes aside at once, without waiting for the lock
        qtbot.waitUntil(lambda: len(r.chain.delivered) == 2, timeout=30_000)
    finally:
        locker.stdin.close()
        locker.wait(10)
    # the lock is gone: what was kept aside is replayed into the history, outcomes included
    qtbot.waitUntil(lambda: len([row for row in _rows(db_path) if row[2] == Outcome.PASTED]) == 2, timeout=20_000)
    texts = [row[1] for row in _rows(db_path)]
    assert texts == r.chain.delivered
    qtbot.waitUntil(lambda: any(level == "info" and "history works again" in m for level, m in r.notes), timeout=5000)
    assert not (tmp_path / "history-unsaved.jsonl").exists()  # deleted before the note was sent


@pytest.mark.parametrize("journal_full", [False, True], ids=["database-full", "disk-full"])
def test_a_full_disk_still_types_and_the_text_reaches_the_history_once_there_is_room(
    rig, qtbot, tmp_path, monkeypatch, journal_full
):
    full = {"on": False}
    real_transaction, real_append = History._transaction, Journal.append

    def transaction(self):
        if full["on"]:
            raise sqlite3.OperationalError("database or disk is full")
        return real_transaction(self)

    def append(self, record):
        if full["on"] and journal_full:
            raise OSError(errno.ENOSPC, f"{self.path}: No space left on device")
        return real_append(self, record)

    monkeypatch.setattr(History, "_transaction", transaction)
    monkeypatch.setattr(Journal, "append", append)
    r = _ordered_rig(rig, tmp_path)
    r.start()
    r.wait_status(Status.IDLE)
    full["on"] = True
    r.dictate(speech(3.0))
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    r.wait_status(Status.IDLE)
    typed = r.chain.delivered[0]
    assert typed.strip()
    assert r.chain.found_at_typing == [(False, not journal_full)]
    if journal_full:  # kept in memory; the user is told what that means
        assert any(level == "error" and "kept in memory" in m for level, m in r.notes)
    qtbot.wait(500)  # retries while the disk is full change nothing
    assert _rows(tmp_path / "history.sqlite3") == []
    full["on"] = False  # room again
    qtbot.waitUntil(
        lambda: [row[1:3] for row in _rows(tmp_path / "history.sqlite3")] == [(typed, Outcome.PASTED)], timeout=20_000
    )
    qtbot.waitUntil(lambda: any(lv == "info" and "history works again" in m for lv, m in r.notes), timeout=5000)
    assert not (tmp_path / "history-unsaved.jsonl").exists()


# ---- items 3 and 4: takes a crash or a quit interrupted ----------------------------------------------


def _crashed_take(tmp_path: Path, audio: np.ndarray, *, finished: bool) -> tuple[int, Path]:
    """What a killed app leaves: a take's file (growing, or whole) and its pending entry."""
    take = TakeFile.create(16_000, directory=tmp_path / "recordings")
    for chunk in np.array_split(audio, 4):
        take.append(chunk)
    if finished:  # killed while transcribing: the whole take was saved
        take.finish(audio)
    else:  # killed while recording: the file as appended so far (the process died with it open)
        take.close()
    with History(tmp_path / "history.sqlite3") as history:
        entry_id = history.add("", audio_path=take.path, created=datetime.now(timezone.utc))
    return entry_id, take.path


@pytest.mark.parametrize("finished", [False, True], ids=["killed-recording", "killed-transcribing"])
def test_a_take_a_crash_interrupted_is_transcribed_into_the_history_at_start_and_never_typed(
    rig, qtbot, tmp_path, engine_factory, ckpt_untied, finished
):
    audio = speech(3.0, seed=4)
    entry_id, path = _crashed_take(tmp_path, audio, finished=finished)
    r = rig()
    r.start()
    qtbot.waitUntil(lambda: r.history.get(entry_id).outcome != Outcome.PENDING, timeout=30_000)
    entry = r.history.get(entry_id)
    saved = load_audio_16k(path)  # the take as it reached the disk (16-bit)
    assert len(saved) == len(audio)
    span = find_speech(saved)  # trimmed at both ends: a recovered take was never streamed
    expected = engine_factory(ckpt_untied).transcribe(saved[span.start : span.end]).text
    assert expected.strip()
    assert entry.outcome == Outcome.RECOVERED
    assert entry.text == expected + " "  # the same text options as a typed dictation
    assert entry.audio_path == path and path.is_file()
    assert r.chain.delivered == []  # never typed into whatever has the focus at start-up
    assert any(level == "info" and "Recovered 1 dictation" in m and "nothing was typed" in m for level, m in r.notes)
    r.wait_status(Status.IDLE)


def test_a_quit_while_recording_leaves_the_take_for_the_next_start(rig, qtbot, tmp_path):
    first = rig()
    first.start()
    first.wait_status(Status.IDLE)
    audio = speech(3.0, seed=6)
    first.hold(audio)
    first.recorders.recorder.arrive_per_read = 8000
    qtbot.waitUntil(lambda: sum(n for _, n in first.recorders.recorder.reads) >= 16_000, timeout=10_000)
    first.close()  # quit while the key is held
    pending = History(tmp_path / "history.sqlite3").pending_takes()
    assert len(pending) == 1 and pending[0].audio_path.is_file()
    second = rig()
    second.start()
    entry_id = pending[0].id
    qtbot.waitUntil(lambda: second.history.get(entry_id).outcome == Outcome.RECOVERED, timeout=30_000)
    assert second.history.get(entry_id).text.strip() and second.chain.delivered == []


def test_leftovers_without_audio_are_marked_and_empty_takes_removed(rig, qtbot, tmp_path):
    folder = tmp_path / "recordings"
    empty = TakeFile.create(16_000, directory=folder)  # killed right at the press: a header, no audio
    empty.close()
    with History(tmp_path / "history.sqlite3") as history:
        lost = history.add("", audio_path=folder / "rec-gone.wav")
        nothing = history.add("", audio_path=empty.path)
    r = rig()
    r.start()
    qtbot.waitUntil(lambda: r.history.get(nothing) is None, timeout=20_000)
    assert not empty.path.exists()
    outcome = r.history.get(lost).outcome
    assert outcome.startswith(Outcome.FAILED_PREFIX) and "recording was not kept" in outcome
    r.wait_status(Status.IDLE)  # (the model loaded: the app quits cleanly)


def test_pruning_never_removes_the_audio_of_a_pending_or_corrected_entry(qtbot, tmp_path):
    """An old take still waiting for its text, and one whose text the user corrected (training
    material for a personal adapter), keep their recordings however many come after them."""
    from dictation.audio.recordings import list_recordings, save_recording

    folder = tmp_path / "recordings"
    db_path = tmp_path / "history.sqlite3"
    waiting = save_recording(speech(0.5), directory=folder)
    corrected = save_recording(speech(0.4), directory=folder)
    with History(db_path) as history:
        waiting_id = history.add("", audio_path=waiting)  # e.g. the model failed before it was done
        history.correct(history.add("helo", audio_path=corrected, outcome=Outcome.PASTED), "Hello.")
        old = [save_recording(speech(0.2), directory=folder) for _ in range(3)]
        for path in old:
            history.add("done", audio_path=path, outcome=Outcome.PASTED)
    worker = history_worker.HistoryWorker(db_path)
    worker._recovery_done = True  # (recovery is tested above; here only pruning)
    worker.open()
    take = TakeFile.create(16_000, directory=folder)
    worker.begin_take(1, take.path)
    take.finish(speech(0.3))
    worker.store_text(1, {"text": "new", "audio_path": take.path})
    worker.finish_take(1, {"outcome": Outcome.PASTED}, False, 1)
    worker.close()
    assert list_recordings(folder) == [waiting, corrected, take.path]  # the old finished ones went
    with History(db_path) as history:
        assert history.get(waiting_id).outcome == Outcome.PENDING


def test_recordings_are_kept_while_the_history_cannot_say_which_are_pending(qtbot, tmp_path, monkeypatch):
    from dictation.audio.recordings import list_recordings, save_recording

    folder = tmp_path / "recordings"
    db_path = tmp_path / "history.sqlite3"
    old = [save_recording(speech(0.2), directory=folder) for _ in range(3)]
    worker = history_worker.HistoryWorker(db_path)
    worker._recovery_done = True
    worker.open()
    real = History._transaction

    def broken(self):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(History, "_transaction", broken)
    take = TakeFile.create(16_000, directory=folder)
    worker.begin_take(1, take.path)
    take.finish(speech(0.3))
    worker.finish_take(1, {"text": "x", "outcome": Outcome.PASTED}, False, 1)
    assert list_recordings(folder) == [*old, take.path]  # nothing deleted while the entries are aside
    monkeypatch.setattr(History, "_transaction", real)
    worker.close()
