"""The dictation history: one SQLite row per dictation (docs/architecture.md, principle 7).

Every take gets its row when its recording starts: empty text, outcome ``"pending"`` and the
path of the recording being written (`pending_takes` finds the ones a crash interrupted, so the
app can transcribe them at its next start; the app never deletes their audio). The transcript goes
in *before* it is typed (`update`), then the outcome: ``"pasted"`` (or ``"typed"``,
``"clipboard_only"``, ``Outcome.kept("not delivered: no window had the keyboard focus")`` for text
left on the clipboard on purpose, ``"recovered"`` for a take transcribed after a crash and never
typed, ``Outcome.failed("no paste tool")``). A crash between the two leaves the text in the history,
marked pending.

Durability: WAL journal, ``synchronous=FULL`` and one transaction per change, so a committed row
survives the process being killed and the machine losing power; an interrupted write rolls back.
A file that is not a database at all is moved aside (``history.sqlite3.bad-<UTC time>``) and a new
one started, so dictation keeps working. The folder is 0700 and the database with its -wal/-shm
files 0600, whatever the umask (`_make_private`).

Threads: one connection guarded by a lock; each call holds the lock for one short statement or
transaction. The app writes through its own History on a worker thread (`HistoryWorker`, with a
short ``busy_timeout_s``: a database locked by another program makes it fall back to a file
instead of waiting) and reads through another on the GUI thread (WAL readers do not wait for
writers).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dictation.config.history_schema import COLUMNS, MIGRATIONS, legacy_streamed, parse_timings
from dictation.private import create_private_file, make_private, private_dir

log = logging.getLogger(__name__)

DEFAULT_MAX_ENTRIES = 1000
IN_MEMORY = ":memory:"  # History(IN_MEMORY): kept until closed, for when the file cannot be opened


class HistoryError(Exception):
    """The history database cannot be opened or used."""


class Outcome:
    """What happened to a transcript after it was stored."""

    PENDING = "pending"
    TYPED = "typed"
    PASTED = "pasted"
    CLIPBOARD_ONLY = "clipboard_only"  # left on the clipboard; the user was told to paste it
    RECOVERED = "recovered"  # a take a crash interrupted, transcribed at the next start; never typed
    KNOWN = (PENDING, TYPED, PASTED, CLIPBOARD_ONLY, RECOVERED)
    FAILED_PREFIX = "failed: "
    KEPT_PREFIX = CLIPBOARD_ONLY + ": "  # on the clipboard, with why it was not sent ("not delivered: ...")
    COMMAND_PREFIX = "command: "  # a voice command that typed no text: what it did ("scratch that: ...")

    @staticmethod
    def failed(reason: str) -> str:
        return Outcome.FAILED_PREFIX + (" ".join(reason.split()) or "unknown reason")

    @staticmethod
    def kept(reason: str) -> str:
        """Left on the clipboard on purpose, and why (e.g. no window had the keyboard focus)."""
        return Outcome.KEPT_PREFIX + (" ".join(reason.split()) or "unknown reason")

    @staticmethod
    def command(what: str) -> str:
        """A voice command that typed no text, and what it did."""
        return Outcome.COMMAND_PREFIX + (" ".join(what.split()) or "done")

    @staticmethod
    def is_valid(outcome: str) -> bool:
        return outcome in Outcome.KNOWN or any(
            outcome.startswith(prefix) and bool(outcome[len(prefix) :].strip())
            for prefix in (Outcome.FAILED_PREFIX, Outcome.KEPT_PREFIX, Outcome.COMMAND_PREFIX)
        )


@dataclass(frozen=True)
class HistoryEntry:
    id: int
    created: datetime  # UTC, timezone-aware
    text: str
    language: str | None
    duration_s: float | None
    model_label: str | None
    audio_path: Path | None
    outcome: str
    timings: dict[str, float] | None  # seconds per stage of its transcription
    streamed: bool = False  # transcribed while it was recorded: re-transcribed, it is trimmed at its end only
    corrected: bool = False  # the user edited the text: training material (`corrected_entries`), never pruned
    raw_text: str | None = None  # the transcript as the model wrote it, before voice commands and text options


def default_path() -> Path:
    from dictation.paths import data_dir

    return data_dir() / "history.sqlite3"


class History:
    """The history store. ``max_entries``: keep only the newest N (pruned on every insert)."""

    def __init__(
        self, path: Path | str | None = None, max_entries: int = DEFAULT_MAX_ENTRIES, *, busy_timeout_s: float = 10.0
    ):
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.path = Path(path) if path is not None else default_path()
        self._max_entries = max_entries
        self._busy_timeout_s = busy_timeout_s  # how long a write waits for another program's lock
        self._lock = threading.RLock()
        self._conn = self._open()

    # --- opening ---------------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        self._make_private()
        try:
            return self._connect()
        except sqlite3.DatabaseError as e:
            if "not a database" not in str(e) and "malformed" not in str(e):
                raise HistoryError(f"{self.path}: {e}") from e
            aside = self.path.with_name(f"{self.path.name}.bad-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}")
            log.error("%s is damaged (%s); moved it to %s and started a new history", self.path, e, aside)
            for suffix in ("", "-wal", "-shm"):
                src = Path(str(self.path) + suffix)
                if src.exists():
                    src.replace(Path(str(aside) + suffix))
            self._make_private()
            try:
                return self._connect()
            except sqlite3.DatabaseError as e2:
                raise HistoryError(f"{self.path}: {e2}") from e2

    def _make_private(self) -> None:
        """The folder 0700 and the database 0600 before SQLite opens it: SQLite would create it 0644,
        and gives its -wal, -shm and -journal files the database's mode. Those of an older install
        are made 0600 too. Failing here (a folder in the database's place, a read-only folder) is a
        HistoryError like any other database that cannot be opened."""
        if str(self.path) == IN_MEMORY:
            return
        try:
            private_dir(self.path.parent)
            create_private_file(self.path)
        except OSError as e:
            raise HistoryError(f"{e.filename or self.path}: {e.strerror or e}") from e
        for suffix in ("-wal", "-shm", "-journal"):
            make_private(Path(str(self.path) + suffix))

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; _transaction() opens them explicitly.
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False)
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal" and str(self.path) != IN_MEMORY:
                log.warning("%s: no WAL journal (got %s); writes still use transactions", self.path, mode)
            conn.execute("PRAGMA synchronous=FULL")
            conn.create_function("casefold", 1, _casefold, deterministic=True)
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        target = len(MIGRATIONS)
        while True:
            conn.execute("BEGIN IMMEDIATE")  # re-read the version under the write lock: another process may migrate
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version >= target:
                    conn.execute("COMMIT")
                    break
                MIGRATIONS[version](conn)
                conn.execute(f"PRAGMA user_version = {version + 1}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            log.info("%s: history schema upgraded to version %d", self.path, version + 1)
        have = {row[1] for row in conn.execute("PRAGMA table_info(dictations)")}
        missing = [c for c in COLUMNS if c not in have]
        if missing and version > target:
            raise HistoryError(
                f"{self.path}: written by a newer version (schema {version}) without the columns {missing}"
            )
        if missing:  # another program's table, or one edited by hand: every write would fail
            what = "has no dictations table" if not have else f"its dictations table lacks the columns {missing}"
            raise HistoryError(f"{self.path}: {what}")
        if version > target:
            log.warning("%s is from a newer version (schema %d > %d); using it as is", self.path, version, target)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    # --- writing ---------------------------------------------------------------------------------

    def add(
        self,
        text: str,
        *,
        language: str | None = None,
        duration_s: float | None = None,
        model_label: str | None = None,
        audio_path: Path | str | None = None,
        timings: dict[str, float] | None = None,
        outcome: str = Outcome.PENDING,
        created: datetime | None = None,
        streamed: bool = False,
    ) -> int:
        """Store a transcript (committed when this returns) and prune beyond ``max_entries``; its id."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        _check_outcome(outcome)
        created = created or datetime.now(timezone.utc)
        if created.tzinfo is None:
            raise ValueError("created must be timezone-aware")
        timings, legacy = legacy_streamed(timings)
        row = (
            _created_text(created),
            text,
            language or None,
            None if duration_s is None else float(duration_s),
            model_label or None,
            None if audio_path is None else str(audio_path),
            outcome,
            None if timings is None else json.dumps(timings),
            int(streamed or legacy),
        )
        with self._transaction() as conn:
            cur = conn.execute(
                "INSERT INTO dictations (created, text, language, duration_s, model_label, audio_path, outcome,"
                " timings, streamed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            entry_id = cur.lastrowid
            self._prune(conn)
        return entry_id

    def set_outcome(self, entry_id: int, outcome: str) -> bool:
        """Record what happened to the text; False if the entry is gone (deleted or pruned meanwhile)."""
        _check_outcome(outcome)
        with self._transaction() as conn:
            return conn.execute("UPDATE dictations SET outcome = ? WHERE id = ?", (outcome, entry_id)).rowcount == 1

    def update_text(
        self,
        entry_id: int,
        text: str,
        *,
        language: str | None = None,
        model_label: str | None = None,
        timings: dict[str, float] | None = None,
    ) -> bool:
        """Replace an entry's transcript (a re-transcription: the text is the model's again, so the
        entry is no longer marked corrected); False if the entry is gone."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        row = (text, language or None, model_label or None, None if timings is None else json.dumps(timings), entry_id)
        with self._transaction() as conn:
            sql = (
                "UPDATE dictations SET text = ?, language = ?, model_label = ?, timings = ?, corrected = 0 WHERE id = ?"
            )
            return conn.execute(sql, row).rowcount == 1

    def correct(self, entry_id: int, text: str) -> bool:
        """The user's own version of an entry's transcript: replaces the text and marks the entry
        corrected, which keeps it and its recording from pruning and makes it training material
        (`corrected_entries`). False if the entry is gone; ValueError for a text with nothing in it
        (delete the entry instead)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        if not text.strip():
            raise ValueError("a corrected transcript cannot be empty")
        with self._transaction() as conn:
            sql = "UPDATE dictations SET text = ?, corrected = 1 WHERE id = ? AND outcome != ?"
            if conn.execute(sql, (text, entry_id, Outcome.PENDING)).rowcount == 1:
                return True
            if conn.execute("SELECT 1 FROM dictations WHERE id = ?", (entry_id,)).fetchone():
                raise ValueError(f"entry {entry_id} is still being transcribed; correct it when its text is in")
            return False

    def update(self, entry_id: int, **fields: Any) -> bool:
        """Change any of an entry's fields (``text``, ``language``, ``duration_s``, ``model_label``,
        ``audio_path``, ``outcome``, ``timings``, ``streamed``) in one transaction; False if the entry is gone."""
        columns, values = _row_values(fields)
        if not columns:
            return self.get(entry_id) is not None
        with self._transaction() as conn:
            sql = f"UPDATE dictations SET {', '.join(c + ' = ?' for c in columns)} WHERE id = ?"
            return conn.execute(sql, (*values, entry_id)).rowcount == 1

    def restore(self, entry_id: int | None, created: datetime, **fields: Any) -> int:
        """Bring an entry to these fields: update ``entry_id`` if it still exists, else the entry made
        at ``created`` with the same audio (an earlier replay), else add it. Replaying the same record
        twice changes nothing. Returns the entry's id."""
        created_text = _created_text(created)
        with self._transaction() as conn:
            found = None
            if entry_id is not None and conn.execute("SELECT 1 FROM dictations WHERE id = ?", (entry_id,)).fetchone():
                found = entry_id
            if found is None:
                row = conn.execute(
                    "SELECT id FROM dictations WHERE created = ? AND coalesce(audio_path, '') = ?",
                    (created_text, "" if fields.get("audio_path") is None else str(fields["audio_path"])),
                ).fetchone()
                found = row[0] if row else None
            if found is None:
                fields.setdefault("text", "")
                columns, values = _row_values(fields)
                sql = f"INSERT INTO dictations (created, {', '.join(columns)}) VALUES (?{', ?' * len(columns)})"
                found = conn.execute(sql, (created_text, *values)).lastrowid
                self._prune(conn)
            else:
                columns, values = _row_values(fields)
                if columns:
                    sql = f"UPDATE dictations SET {', '.join(c + ' = ?' for c in columns)} WHERE id = ?"
                    conn.execute(sql, (*values, found))
        return found

    def set_audio_path(self, entry_id: int, audio_path: Path | str | None) -> bool:
        """Point the entry at its recording, or at none (the file was deleted); False if the entry is gone."""
        value = None if audio_path is None else str(audio_path)
        with self._transaction() as conn:
            return conn.execute("UPDATE dictations SET audio_path = ? WHERE id = ?", (value, entry_id)).rowcount == 1

    def delete(self, entry_id: int) -> bool:
        with self._transaction() as conn:
            return conn.execute("DELETE FROM dictations WHERE id = ?", (entry_id,)).rowcount == 1

    def clear(self) -> int:
        """Delete every entry; how many there were."""
        with self._transaction() as conn:
            return conn.execute("DELETE FROM dictations").rowcount

    @property
    def max_entries(self) -> int:
        return self._max_entries

    @max_entries.setter
    def max_entries(self, value: int) -> None:
        """Apply a new size limit now (settings apply without a restart)."""
        if value < 1:
            raise ValueError(f"max_entries must be at least 1, got {value}")
        with self._transaction() as conn:
            self._max_entries = value
            self._prune(conn)

    def _prune(self, conn: sqlite3.Connection) -> None:
        """Keep the newest ``max_entries`` entries the user did not correct; corrected ones are kept
        besides them (they are the user's training material and count against no limit). A pending
        entry is never pruned however old: a take a crash left untranscribed (or a text whose
        typing was cut short) waits for the next start, and `kept_audio` keeps its recording."""
        removed = conn.execute(
            "DELETE FROM dictations WHERE corrected = 0 AND outcome != ? AND id < (SELECT MIN(id) FROM"
            " (SELECT id FROM dictations WHERE corrected = 0 ORDER BY id DESC LIMIT ?))",
            (Outcome.PENDING, self._max_entries),
        ).rowcount
        if removed:
            log.debug("history: pruned %d old entries (limit %d)", removed, self._max_entries)

    # --- reading ---------------------------------------------------------------------------------

    def get(self, entry_id: int) -> HistoryEntry | None:
        rows = self._query(f"SELECT {', '.join(COLUMNS)} FROM dictations WHERE id = ?", (entry_id,))
        return _entry(rows[0]) if rows else None

    def recent(self, n: int = 50) -> list[HistoryEntry]:
        """The newest ``n`` entries, newest first."""
        rows = self._query(f"SELECT {', '.join(COLUMNS)} FROM dictations ORDER BY id DESC LIMIT ?", (n,))
        return [_entry(r) for r in rows]

    def search(self, query: str, limit: int = 50) -> list[HistoryEntry]:
        """Entries whose text contains ``query``, ignoring case in any script; newest first.

        A plain scan (the history is capped, so it stays fast): unlike FTS it finds any substring,
        including two-character Chinese words, and folds case beyond ASCII ("STRASSE" finds "Straße").
        """
        needle = _casefold(query.strip())
        if not needle:
            return self.recent(limit)
        rows = self._query(
            f"SELECT {', '.join(COLUMNS)} FROM dictations WHERE instr(casefold(text), ?) > 0 ORDER BY id DESC LIMIT ?",
            (needle, limit),
        )
        return [_entry(r) for r in rows]

    def pending_takes(self) -> list[HistoryEntry]:
        """Takes not transcribed yet (outcome pending, no text), oldest first: after a crash, the
        ones it interrupted."""
        rows = self._query(
            f"SELECT {', '.join(COLUMNS)} FROM dictations WHERE outcome = ? AND text = '' ORDER BY id",
            (Outcome.PENDING,),
        )
        return [_entry(r) for r in rows]

    def corrected_entries(self) -> list[HistoryEntry]:
        """The entries whose text the user corrected, newest first (what a personal adapter is trained on)."""
        rows = self._query(f"SELECT {', '.join(COLUMNS)} FROM dictations WHERE corrected = 1 ORDER BY id DESC")
        return [_entry(r) for r in rows]

    def kept_audio(self) -> set[Path]:
        """The recordings never pruned: those of entries still pending and of corrected entries."""
        rows = self._query(
            "SELECT audio_path FROM dictations WHERE (outcome = ? OR corrected = 1) AND audio_path IS NOT NULL",
            (Outcome.PENDING,),
        )
        return {Path(r[0]) for r in rows}

    def count(self) -> int:
        return self._query("SELECT COUNT(*) FROM dictations")[0][0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_outcome(outcome: str) -> None:
    if not isinstance(outcome, str) or not Outcome.is_valid(outcome):
        raise ValueError(f"unknown outcome {outcome!r}; use one of {Outcome.KNOWN} or Outcome.failed(reason)")


_FIELDS = tuple(c for c in COLUMNS if c not in ("id", "created"))  # what `update` and `restore` may set


def _created_text(created: datetime) -> str:
    if created.tzinfo is None:
        raise ValueError("created must be timezone-aware")
    return created.astimezone(timezone.utc).isoformat(timespec="milliseconds")


def _row_values(fields: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """Column names and stored values for ``fields`` (checked as `add` checks them)."""
    unknown = set(fields) - set(_FIELDS)
    if unknown:
        raise TypeError(f"unknown history fields: {sorted(unknown)}")
    columns, values = [], []
    for name in _FIELDS:
        if name not in fields:
            continue
        value = fields[name]
        if name == "text" and not isinstance(value, str):
            raise TypeError(f"text must be str, got {type(value).__name__}")
        if name == "outcome":
            _check_outcome(value)
        elif name in ("language", "model_label"):
            value = value or None
        elif name == "duration_s":
            value = None if value is None else float(value)
        elif name == "audio_path":
            value = None if value is None else str(value)
        elif name == "timings":
            value, legacy = legacy_streamed(value)  # a journal record from before version 2
            value = None if value is None else json.dumps(value)
            if legacy and "streamed" not in fields:
                columns.append("streamed")
                values.append(1)
        elif name in ("streamed", "corrected"):
            value = int(bool(value))
        elif name == "raw_text" and value is not None and not isinstance(value, str):
            raise TypeError(f"raw_text must be str or None, got {type(value).__name__}")
        columns.append(name)
        values.append(value)
    return columns, values


def _casefold(text: str | None) -> str | None:
    return None if text is None else text.casefold()


def _entry(row: tuple) -> HistoryEntry:
    entry_id, created, text, language, duration_s, model_label, audio_path, outcome, timings = row[:9]
    streamed, corrected, raw_text = row[9:]
    # an older version may have written a row since (it keeps the flag in the timings): read it too
    parsed_timings, legacy = legacy_streamed(parse_timings(timings))
    return HistoryEntry(
        id=entry_id,
        created=datetime.fromisoformat(created),
        text=text,
        language=language,
        duration_s=duration_s,
        model_label=model_label,
        audio_path=Path(audio_path) if audio_path else None,
        outcome=outcome,
        timings=parsed_timings,
        streamed=bool(streamed) or legacy,
        corrected=bool(corrected),
        raw_text=raw_text,
    )
