"""The SQLite dictation history: store-before-type, search, cap, threads, crash safety, migration."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import textwrap
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dictation.config import History, HistoryError, Outcome, history_schema
from dictation.config import history as history_module


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "history.sqlite3"


@pytest.fixture
def history(db_path):
    with History(db_path) as h:
        yield h


def _texts(entries) -> list[str]:
    return [e.text for e in entries]


def test_default_location_follows_dictation_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DICTATION_HOME", str(tmp_path))
    with History() as h:
        assert h.path == tmp_path / "data" / "history.sqlite3"
        h.add("hello")
    assert h.path.exists()


def test_text_is_stored_pending_before_typing_then_gets_its_outcome(history, db_path):
    entry_id = history.add(
        "Hello world.",
        language="English",
        duration_s=2.5,
        model_label="Qwen3-ASR-0.6B · bf16 · cuda",
        audio_path=Path("/rec/0001.wav"),
        timings={"encode": 0.02, "decode": 0.11},
    )
    # committed and visible to another connection before any outcome is known
    with sqlite3.connect(db_path) as other:
        assert other.execute("SELECT text, outcome FROM dictations").fetchall() == [("Hello world.", "pending")]
    assert history.set_outcome(entry_id, Outcome.PASTED)
    e = history.get(entry_id)
    assert (e.text, e.language, e.duration_s, e.outcome) == ("Hello world.", "English", 2.5, "pasted")
    assert e.model_label == "Qwen3-ASR-0.6B · bf16 · cuda"
    assert e.audio_path == Path("/rec/0001.wav")
    assert e.timings == {"encode": 0.02, "decode": 0.11}
    assert e.created.tzinfo is not None
    assert abs(e.created - datetime.now(timezone.utc)) < timedelta(minutes=1)


def test_outcomes_are_checked(history):
    entry_id = history.add("x")
    for outcome in ("typed", "clipboard_only", Outcome.failed("wtype: compositor lacks virtual keyboard")):
        assert history.set_outcome(entry_id, outcome)
    assert history.get(entry_id).outcome == "failed: wtype: compositor lacks virtual keyboard"
    for bad in ("done", "failed: ", "Pasted", ""):
        with pytest.raises(ValueError):
            history.set_outcome(entry_id, bad)
    assert Outcome.failed("  line one\nline two ") == "failed: line one line two"
    assert history.set_outcome(entry_id + 100, "typed") is False


def test_non_ascii_text_round_trips_and_is_found(history):
    texts = ["Grüße aus Köln", "你好，世界", "Straße", "Ελληνικά ΣΊΣΥΦΟΣ", "emoji 🎤 ok"]
    ids = [history.add(t) for t in texts]
    assert [history.get(i).text for i in ids] == texts
    assert _texts(history.search("GRÜSSE")) == ["Grüße aus Köln"]
    assert _texts(history.search("strasse")) == ["Straße"]
    assert _texts(history.search("你好")) == ["你好，世界"]  # two characters: too short for trigram FTS
    assert _texts(history.search("σίσυφος")) == ["Ελληνικά ΣΊΣΥΦΟΣ"]
    assert _texts(history.search("🎤")) == ["emoji 🎤 ok"]


def test_search_is_a_literal_case_insensitive_substring_newest_first(history):
    for t in ["100% sure", "a_b", "abc", "Deploy to Kubernetes", "kubernetes again"]:
        history.add(t)
    assert _texts(history.search("KUBERNETES")) == ["kubernetes again", "Deploy to Kubernetes"]
    assert _texts(history.search("%")) == ["100% sure"]  # not a wildcard
    assert _texts(history.search("_")) == ["a_b"]
    assert _texts(history.search("kubernetes", limit=1)) == ["kubernetes again"]
    assert _texts(history.search("nothing like this")) == []
    assert _texts(history.search("  ")) == _texts(history.recent(50))


def test_recent_get_delete_clear(history):
    ids = [history.add(f"entry {i}") for i in range(5)]
    assert _texts(history.recent(3)) == ["entry 4", "entry 3", "entry 2"]
    assert history.delete(ids[4])
    assert history.get(ids[4]) is None
    assert history.delete(ids[4]) is False
    assert _texts(history.recent(2)) == ["entry 3", "entry 2"]
    assert history.count() == 4
    assert history.clear() == 4
    assert history.count() == 0 and history.recent() == []
    new_id = history.add("after clear")
    assert new_id > ids[-1]  # ids are never reused: a held id cannot name another dictation


def test_cap_keeps_the_newest_entries_and_applies_a_new_limit_at_once(db_path):
    with History(db_path, max_entries=5) as h:
        ids = [h.add(f"n{i}", outcome=Outcome.PASTED) for i in range(8)]  # pending ones are never pruned
        assert h.count() == 5
        assert _texts(h.recent(10)) == ["n7", "n6", "n5", "n4", "n3"]
        assert h.get(ids[2]) is None
        h.max_entries = 2
        assert _texts(h.recent(10)) == ["n7", "n6"]
        with pytest.raises(ValueError):
            h.max_entries = 0
    with pytest.raises(ValueError):
        History(db_path, max_entries=0)


def test_audio_path_can_be_cleared_when_the_recording_is_deleted(history):
    entry_id = history.add("x", audio_path="/rec/a.wav")
    assert history.set_audio_path(entry_id, None)
    assert history.get(entry_id).audio_path is None


def test_reopening_keeps_everything_and_uses_wal(db_path):
    with History(db_path) as h:
        h.add("persisted", language="German")
    with History(db_path) as h:
        assert _texts(h.recent()) == ["persisted"]
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(history_module.MIGRATIONS)


def test_concurrent_writers_and_readers_from_threads(db_path):
    n_threads, per_thread = 8, 40
    errors: list[BaseException] = []
    stop = threading.Event()
    with History(db_path, max_entries=10_000) as h, History(db_path, max_entries=10_000) as other_conn:

        def writer(t: int) -> None:
            try:
                store = h if t % 2 else other_conn  # a second connection (as another process would be)
                for i in range(per_thread):
                    entry_id = store.add(f"thread {t} item {i} Grüße")
                    assert store.set_outcome(entry_id, "typed")
            except BaseException as e:  # reported below: a thread's exception would otherwise vanish
                errors.append(e)

        def reader() -> None:
            try:
                while not stop.is_set():
                    h.search("grüsse", limit=20)
                    h.recent(20)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
        read_thread = threading.Thread(target=reader)
        read_thread.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        read_thread.join()
        assert errors == []
        entries = h.recent(10_000)
        assert len(entries) == n_threads * per_thread
        assert len({e.id for e in entries}) == len(entries)
        assert {e.outcome for e in entries} == {"typed"}
        assert {e.text for e in entries} == {
            f"thread {t} item {i} Grüße" for t in range(n_threads) for i in range(per_thread)
        }


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from dictation.config import History

    h = History(sys.argv[1], max_entries=1_000_000)
    if sys.argv[2] == "loop":
        i = 0
        while True:
            entry_id = h.add(f"row {i} " + "Grüße 你好 " * 50, duration_s=i)
            print(entry_id, i, flush=True)  # printed only after the commit
            i += 1
    else:  # die in the middle of a transaction
        h.add("committed before the crash")
        with h._transaction() as conn:
            conn.execute("INSERT INTO dictations (created, text) VALUES ('2020-01-01T00:00:00+00:00', 'torn')")
            print("inside", flush=True)
            os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))
    """
)


def _integrity_ok(path: Path) -> bool:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_killed_during_an_insert_loop_loses_no_committed_row(db_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db_path), "loop"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    committed: dict[int, int] = {}
    try:
        for line in proc.stdout:
            entry_id, i = map(int, line.split())
            committed[entry_id] = i
            if len(committed) >= 300:
                break
    finally:
        proc.kill()  # SIGKILL: no cleanup, no rollback, likely in the middle of the next insert
        proc.wait(timeout=30)
    assert len(committed) >= 300, proc.stderr.read()
    assert _integrity_ok(db_path)
    with History(db_path, max_entries=1_000_000) as h:
        for entry_id, i in committed.items():
            e = h.get(entry_id)
            assert e is not None and e.text.startswith(f"row {i} ") and e.duration_s == i
        h.add("still writable")
        assert h.count() >= len(committed) + 1


def test_killed_inside_a_transaction_rolls_back_only_that_transaction(db_path):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(db_path), "torn"], capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.strip() == "inside", proc.stderr
    assert proc.returncode != 0
    assert _integrity_ok(db_path)
    with History(db_path) as h:
        assert _texts(h.recent()) == ["committed before the crash"]


def test_a_file_that_is_not_a_database_is_moved_aside_and_a_new_history_started(db_path, caplog):
    db_path.write_bytes(b"this is not sqlite" * 100)
    with caplog.at_level(logging.ERROR), History(db_path) as h:
        h.add("works again")
        assert _texts(h.recent()) == ["works again"]
    (aside,) = db_path.parent.glob("history.sqlite3.bad-*")
    assert aside.read_bytes() == b"this is not sqlite" * 100
    assert "moved it to" in caplog.text


def test_migrations_run_in_order_and_keep_rows(db_path, monkeypatch):
    with History(db_path) as h:
        h.add("from version 1")

    def add_starred(conn):
        conn.execute("ALTER TABLE dictations ADD COLUMN starred INTEGER NOT NULL DEFAULT 0")

    monkeypatch.setattr(history_module, "MIGRATIONS", [*history_module.MIGRATIONS, add_starred])
    with History(db_path) as h:
        assert _texts(h.recent()) == ["from version 1"]
        h.add("from version 2")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(history_module.MIGRATIONS)  # the new one ran
        assert conn.execute("SELECT text, starred FROM dictations ORDER BY id").fetchall() == [
            ("from version 1", 0),
            ("from version 2", 0),
        ]


def test_a_failed_migration_rolls_back_and_leaves_the_old_schema(db_path, monkeypatch):
    with History(db_path) as h:
        h.add("kept")

    def broken(conn):
        conn.execute("ALTER TABLE dictations ADD COLUMN half_done TEXT")
        raise RuntimeError("migration bug")

    monkeypatch.setattr(history_module, "MIGRATIONS", [*history_module.MIGRATIONS, broken])
    with pytest.raises(RuntimeError, match="migration bug"):
        History(db_path)
    monkeypatch.undo()
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(history_module.MIGRATIONS)  # not the broken one
        assert "half_done" not in {row[1] for row in conn.execute("PRAGMA table_info(dictations)")}
    with History(db_path) as h:
        assert _texts(h.recent()) == ["kept"]


def test_a_database_from_a_newer_version_is_used_if_it_has_our_columns(db_path, caplog):
    with History(db_path) as h:
        h.add("kept")
    with sqlite3.connect(db_path) as conn:
        conn.execute("PRAGMA user_version = 7")
    with caplog.at_level(logging.WARNING), History(db_path) as h:
        assert _texts(h.recent()) == ["kept"]
    assert "newer version" in caplog.text
    with sqlite3.connect(db_path) as conn:
        conn.execute("ALTER TABLE dictations DROP COLUMN timings")
    with pytest.raises(HistoryError, match="timings"):
        History(db_path)


def test_update_text_replaces_a_transcript_and_survives_reopening(history, db_path):
    entry_id = history.add("helo wrld", language="English", model_label="old", audio_path="/r/a.wav")
    assert history.update_text(entry_id, "hello world", language="English", model_label="new", timings={"total_s": 1.5})
    history.close()
    reopened = History(db_path)
    entry = reopened.get(entry_id)
    assert (entry.text, entry.model_label, entry.timings) == ("hello world", "new", {"total_s": 1.5})
    assert entry.audio_path == Path("/r/a.wav")
    assert reopened.update_text(entry_id + 100, "x") is False
    reopened.close()


# ---- takes: pending entries, changes in one step, replay, another program's lock -------------------


def test_a_take_is_pending_without_text_until_its_transcript_comes(history, tmp_path):
    audio = tmp_path / "rec-1.wav"
    take = history.add("", audio_path=audio)
    done = history.add("typed before", audio_path=tmp_path / "rec-0.wav", outcome=Outcome.PASTED)
    typing = history.add("being typed", audio_path=tmp_path / "rec-2.wav")
    assert [e.id for e in history.pending_takes()] == [take]  # pending text is not a pending take
    assert history.kept_audio() == {audio, tmp_path / "rec-2.wav"}  # neither audio may be pruned
    assert history.update(take, text="Hi.", language="English", duration_s=1.5, timings={"decode": 0.1})
    entry = history.get(take)
    assert (entry.text, entry.language, entry.duration_s, entry.timings) == ("Hi.", "English", 1.5, {"decode": 0.1})
    assert history.pending_takes() == []
    assert history.update(take, outcome=Outcome.RECOVERED, audio_path=None)
    assert history.get(take).outcome == Outcome.RECOVERED and history.get(take).audio_path is None
    assert history.kept_audio() == {tmp_path / "rec-2.wav"}
    assert not history.update(9999, text="gone")
    with pytest.raises(ValueError, match="unknown outcome"):
        history.update(done, outcome="bogus")
    with pytest.raises(TypeError, match="unknown history fields"):
        history.update(done, colour="red")
    assert history.get(typing).text == "being typed"


def test_restore_updates_or_adds_and_a_second_replay_changes_nothing(history, tmp_path):
    created = datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=timezone.utc)
    audio = tmp_path / "rec-a.wav"
    first = history.restore(None, created, text="kept aside", audio_path=audio, outcome=Outcome.PASTED)
    again = history.restore(None, created, text="kept aside", audio_path=audio, outcome=Outcome.PASTED)
    assert first == again and history.count() == 1  # found by its time and audio, not added twice
    existing = history.add("", audio_path=tmp_path / "rec-b.wav")
    assert history.restore(existing, created, text="its text", outcome=Outcome.TYPED) == existing
    assert history.get(existing).text == "its text" and history.get(existing).outcome == Outcome.TYPED
    assert history.count() == 2


_LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
conn.execute("COMMIT")
"""


def test_a_short_busy_timeout_gives_up_on_another_programs_lock_quickly(db_path):
    """Another program holding the write lock: the app's writer gives up after its timeout (then
    the app keeps the entry aside) instead of waiting the default 10 s."""
    import time

    writer, reader = History(db_path, busy_timeout_s=0.3), History(db_path)
    locker = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(db_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert locker.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            writer.add("blocked")
        assert time.monotonic() - t0 < 2.0
        assert reader.count() == 0  # an open connection reads on under the lock (WAL)
        with pytest.raises(HistoryError, match="locked"):
            History(db_path, busy_timeout_s=0.3)  # opening needs the write lock (schema check)
    finally:
        locker.stdin.close()
        locker.wait(10)
        reader.close()
    writer.add("after")
    assert writer.count() == 1
    writer.close()


# --- whether a take was streamed: a column since version 2, a timings key before -----------------


def _version_1_database(path: Path, rows: list[tuple[str, str | None]]) -> None:
    """A history as version 1 wrote it: the streamed flag was ``"streamed": 1.0`` in the timings."""
    with sqlite3.connect(path) as conn:
        history_schema._create_v1(conn)
        for text, timings in rows:
            conn.execute(
                "INSERT INTO dictations (created, text, outcome, timings) VALUES (?, ?, 'pasted', ?)",
                ("2026-01-01T00:00:00.000+00:00", text, timings),
            )
        conn.execute("PRAGMA user_version = 1")


def test_a_version_1_history_loads_with_its_streamed_takes_moved_to_the_column(db_path):
    _version_1_database(
        db_path,
        [
            ("streamed", '{"total": 0.5, "streamed": 1.0}'),
            ("whole", '{"total": 0.7}'),
            ("no timings", None),
            ("damaged timings", '{"streamed": '),
        ],
    )
    with History(db_path) as h:
        entries = {e.text: e for e in h.recent()}
    assert {text: e.streamed for text, e in entries.items()} == {
        "streamed": True,
        "whole": False,
        "no timings": False,
        "damaged timings": False,
    }
    assert entries["streamed"].timings == {"total": 0.5}  # the flag is no timing any more
    assert entries["whole"].timings == {"total": 0.7}
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(history_module.MIGRATIONS)
        assert conn.execute("SELECT text, streamed FROM dictations ORDER BY id").fetchall() == [
            ("streamed", 1),
            ("whole", 0),
            ("no timings", 0),
            ("damaged timings", 0),
        ]


def test_streamed_is_a_field_and_old_shaped_writes_are_read_alike(history, db_path):
    first = history.add("a", timings={"total": 0.5}, streamed=True)
    second = history.add("b", timings={"total": 0.5})
    assert (history.get(first).streamed, history.get(second).streamed) == (True, False)
    assert history.update(second, streamed=True) and history.get(second).streamed
    # a journal record kept by version 1 and replayed now: the flag inside the timings
    third = history.restore(None, datetime.now(timezone.utc), text="c", timings={"total": 0.2, "streamed": 1.0})
    assert history.get(third).streamed and history.get(third).timings == {"total": 0.2}
    # a row an older version wrote into this database (it knows no column, so it keeps the key)
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE dictations SET timings = ? WHERE id = ?", ('{"total": 0.1, "streamed": 1.0}', first))
        conn.execute("UPDATE dictations SET streamed = 0 WHERE id = ?", (first,))
    assert history.get(first).streamed and history.get(first).timings == {"total": 0.1}


# --- corrected entries: the user's own text, kept for training a personal adapter -------------------


def test_a_correction_replaces_the_text_and_marks_the_entry(history, db_path, tmp_path):
    entry_id = history.add("helo wrld", language="English", audio_path=tmp_path / "rec-1.wav", outcome=Outcome.PASTED)
    other = history.add("fine as it was", outcome=Outcome.PASTED)
    assert not history.get(entry_id).corrected
    assert history.correct(entry_id, "Hello, world.")
    history.close()
    with History(db_path) as reopened:
        entry = reopened.get(entry_id)
        assert (entry.text, entry.corrected, entry.language) == ("Hello, world.", True, "English")
        assert [e.id for e in reopened.corrected_entries()] == [entry_id]
        assert not reopened.get(other).corrected
        assert reopened.correct(9999, "gone") is False
        with pytest.raises(ValueError, match="cannot be empty"):
            reopened.correct(other, "  \n")
        assert not reopened.get(other).corrected and reopened.get(other).text == "fine as it was"
        # a re-transcription puts the model's text back: no longer the user's correction
        assert reopened.update_text(entry_id, "helo world", language="English")
        assert not reopened.get(entry_id).corrected and reopened.corrected_entries() == []


def test_a_take_still_being_transcribed_cannot_be_corrected(history, tmp_path):
    take = history.add("", audio_path=tmp_path / "rec-1.wav")
    with pytest.raises(ValueError, match="still being transcribed"):
        history.correct(take, "my words")
    assert history.get(take).text == "" and not history.get(take).corrected


def test_corrected_entries_and_their_recordings_survive_pruning(db_path, tmp_path):
    with History(db_path, max_entries=3) as h:
        first = h.add("old one", audio_path=tmp_path / "rec-0.wav", outcome=Outcome.PASTED)
        h.correct(first, "Old one, corrected.")
        for i in range(1, 8):
            h.add(f"take {i}", audio_path=tmp_path / f"rec-{i}.wav", outcome=Outcome.PASTED)
        # the limit counts the uncorrected entries; the corrected one is kept beside them
        assert _texts(h.recent(10)) == ["take 7", "take 6", "take 5", "Old one, corrected."]
        assert h.kept_audio() == {tmp_path / "rec-0.wav"}
        h.max_entries = 1
        assert _texts(h.recent(10)) == ["take 7", "Old one, corrected."]
        # the user can still delete it
        assert h.delete(first) and _texts(h.recent(10)) == ["take 7"] and h.kept_audio() == set()


def _recording(folder: Path, second: int) -> Path:
    path = folder / f"rec-20260101T0000{second:02d}.000Z.wav"
    path.write_bytes(b"RIFF")
    return path


def test_a_pending_take_and_its_recording_survive_every_prune(db_path, tmp_path):
    """A take a crash left untranscribed (pending, no text) and a text whose typing was cut short
    (pending, with text) wait for the next start: newer entries past the limit, a smaller limit and
    the recordings' prune (protecting `kept_audio`, as the history worker does) all leave them."""
    from dictation.audio.recordings import list_recordings, prune_recordings

    folder = tmp_path / "recordings"
    folder.mkdir()
    with History(db_path, max_entries=3) as h:
        crashed = h.add("", audio_path=_recording(folder, 0))
        cut_short = h.add("typed when it crashed", audio_path=_recording(folder, 1))
        for i in range(2, 10):
            h.add(f"take {i}", audio_path=_recording(folder, i), outcome=Outcome.PASTED)
        assert [e.id for e in h.pending_takes()] == [crashed]
        assert _texts(h.recent(10)) == ["take 9", "take 8", "take 7", "typed when it crashed", ""]
        h.max_entries = 1
        assert _texts(h.recent(10)) == ["take 9", "typed when it crashed", ""]
        prune_recordings(1, directory=folder, protect=h.kept_audio())
        kept = {p.name for p in list_recordings(folder)}
        assert kept == {
            h.get(crashed).audio_path.name,
            h.get(cut_short).audio_path.name,
            "rec-20260101T000009.000Z.wav",
        }
        # once transcribed it is an ordinary entry and goes with the next prune
        h.update(crashed, text="Recovered.", outcome=Outcome.RECOVERED)
        h.add("take 10", outcome=Outcome.PASTED)
        assert h.get(crashed) is None and h.get(cut_short) is not None


def test_a_recent_corrected_entry_does_not_count_against_the_limit(db_path):
    """The limit counts only uncorrected entries: correcting a recent one must not push an older
    take out (counting it, the next take would prune "take 0")."""
    with History(db_path, max_entries=3) as h:
        ids = [h.add(f"take {i}", outcome=Outcome.PASTED) for i in range(3)]
        h.correct(ids[2], "Take two, corrected.")
        h.add("take 3", outcome=Outcome.PASTED)
        assert _texts(h.recent(10)) == ["take 3", "Take two, corrected.", "take 1", "take 0"]
        h.add("take 4", outcome=Outcome.PASTED)
        assert _texts(h.recent(10)) == ["take 4", "take 3", "Take two, corrected.", "take 1"]


def test_corrected_is_a_field_and_a_version_2_history_gains_it(history, db_path):
    entry_id = history.add("a")
    assert history.update(entry_id, corrected=True) and history.get(entry_id).corrected
    restored = history.restore(None, datetime.now(timezone.utc), text="b", corrected=True)
    assert history.get(restored).corrected
    history.close()
    db_path.unlink()
    with sqlite3.connect(db_path) as conn:
        history_schema._create_v1(conn)
        history_schema._add_streamed_v2(conn)
        conn.execute(
            "INSERT INTO dictations (created, text, outcome) VALUES (?, 'from version 2', 'pasted')",
            ("2026-01-01T00:00:00.000+00:00",),
        )
        conn.execute("PRAGMA user_version = 2")
    with History(db_path) as h:
        (entry,) = h.recent()
        assert entry.text == "from version 2" and not entry.corrected
        assert h.correct(entry.id, "From version 2.") and [e.text for e in h.corrected_entries()] == ["From version 2."]


# --- the raw transcript beside the text as typed: a column since version 4 ---------------------------


def test_a_version_3_history_gets_the_raw_transcript_column_and_keeps_its_rows(db_path):
    with sqlite3.connect(db_path) as conn:
        for step in history_module.MIGRATIONS[:3]:
            step(conn)
        conn.execute(
            "INSERT INTO dictations (created, text, outcome) VALUES ('2026-01-01T00:00:00.000+00:00', 'old', 'typed')"
        )
        conn.execute("PRAGMA user_version = 3")
    with History(db_path) as h:
        [old] = h.recent()
        assert (old.text, old.raw_text) == ("old", None)
        entry_id = h.add("Hello there.\n")
        assert h.update(entry_id, raw_text="Hello there. New line.")
        assert h.get(entry_id).raw_text == "Hello there. New line."
        with pytest.raises(TypeError, match="raw_text"):
            h.update(entry_id, raw_text=5)
        restored = h.restore(None, old.created, text="again", raw_text="Again.", audio_path=None)
        assert h.get(restored).raw_text == "Again."
