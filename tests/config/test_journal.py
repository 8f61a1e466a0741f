"""The journal a dictation goes to when the history database cannot take it, and its replay."""

from __future__ import annotations

import os
import stat
from datetime import datetime, timezone

import pytest

from dictation.config import History, Outcome
from dictation.config.journal import Journal, Record, replay

T0 = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)


def test_the_newest_record_of_each_key_wins_and_the_file_is_private(tmp_path):
    journal = Journal(tmp_path / "data" / "history-unsaved.jsonl")
    assert not journal.exists() and journal.records() == []
    journal.append(Record("a", T0, fields={"text": "", "outcome": Outcome.PENDING}))
    journal.append(Record("b", T0, fields={"text": "Grüße, 你好 ✓", "outcome": Outcome.PENDING}))
    journal.append(Record("a", T0, entry_id=7, fields={"text": "first", "outcome": Outcome.PASTED}))
    assert journal.exists()
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    records = journal.records()
    assert [(r.key, r.entry_id, r.fields["text"]) for r in records] == [("a", 7, "first"), ("b", None, "Grüße, 你好 ✓")]
    assert records[0].created == T0
    journal.clear()
    assert not journal.exists()


def test_a_torn_last_line_is_skipped(tmp_path, caplog):
    journal = Journal(tmp_path / "j.jsonl")
    journal.append(Record("a", T0, fields={"text": "kept"}))
    with open(journal.path, "ab") as f:
        f.write(b'{"key": "b", "created": "2026-03-01T12:')  # the app died while writing
    assert [r.key for r in journal.records()] == ["a"]
    assert "line 2: skipped" in caplog.text


def test_append_errors_name_the_file(tmp_path, monkeypatch):
    import errno

    journal = Journal(tmp_path / "j.jsonl")

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="j.jsonl: No space left on device") as caught:
        journal.append(Record("a", T0, fields={"text": "x"}))
    assert caught.value.errno == errno.ENOSPC


def test_append_fsyncs_the_journal_after_writing_the_whole_record(tmp_path, monkeypatch):
    """Durable when append returns: the record's bytes are in the file when it is fsynced."""
    journal = Journal(tmp_path / "j.jsonl")
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append((os.path.realpath(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    journal.append(Record("a", T0, fields={"text": "kept"}))
    journal.append(Record("b", T0, fields={"text": "also kept"}))
    sizes = [len(line) + 1 for line in journal.path.read_bytes().decode().splitlines()]
    assert synced == [(str(journal.path.resolve()), sizes[0]), (str(journal.path.resolve()), sum(sizes))]


def test_an_fsync_failure_is_an_error_naming_the_file(tmp_path, monkeypatch):
    import errno

    journal = Journal(tmp_path / "j.jsonl")

    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="j.jsonl: Input/output error") as caught:
        journal.append(Record("a", T0, fields={"text": "x"}))
    assert caught.value.errno == errno.EIO


def test_replay_brings_the_history_to_the_records_and_twice_changes_nothing(tmp_path):
    with History(tmp_path / "history.sqlite3") as history:
        existing = history.add("", audio_path=tmp_path / "rec-1.wav")
        cancelled = history.add("", audio_path=tmp_path / "rec-2.wav")
        records = [
            Record("live", T0, entry_id=existing, fields={"text": "typed", "outcome": Outcome.PASTED}),
            Record(
                "new",
                T0,
                fields={"text": "while locked", "audio_path": str(tmp_path / "rec-3.wav"), "outcome": Outcome.PASTED},
            ),
            Record("gone", T0, entry_id=cancelled, deleted=True),
        ]
        ids = replay(history, records)
        assert ids["live"] == existing and ids["gone"] is None
        assert history.get(existing).text == "typed" and history.get(cancelled) is None
        assert history.get(ids["new"]).text == "while locked"
        assert replay(history, records) == ids
        assert history.count() == 2
