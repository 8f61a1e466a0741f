"""`HistoryWorker`: every history write on its own thread, so SQLite never blocks the GUI.

`Takes` sends it one request per step of a dictation, as calls queued onto its thread, in order:

- ``begin_take(take, audio_path)`` when the recording starts: an entry with empty text, outcome
  pending and the path of the recording being written. It answers ``ready(take, durable)``; the
  app transcribes a take only after that, so a crash at any later point leaves an entry
  pointing at the audio, found at the next start (`History.pending_takes`).
- ``store_text(take, fields)`` with the transcript: answers ``stored(take, durable)``, and only then
  does the app type the text. History first, typing second.
- ``finish_take(take, fields, delete_audio, keep)`` with the outcome; ``discard_take`` for a take
  that ends without text (cancelled, too short, no speech). Both prune old recordings, never one
  that a pending entry points at.

Failures never hold a dictation up. Its own connection waits at most ``BUSY_TIMEOUT_S`` for
another program's lock; when a write fails (locked, disk full, I/O error, the database cannot be
opened) the entry goes to the journal file beside it (`dictation.config.journal`), and from then
on every write goes there until the journal has been replayed into the database, which is tried
every ``RETRY_MS``. If even the journal cannot be written (the disk is full), the entry is kept in
memory and tried again the same way: ``durable`` is False, the user is told, and the text is
typed anyway. The user hears about a failure once, and again when it is over.

At `open` (the first request) the journal is replayed, then the takes a crash left pending are
read from disk and handed to the controller (``recovered``) to be transcribed: their text goes
into the history as ``recovered``, never typed.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, QTimer, Signal, Slot

from dictation.config.history import DEFAULT_MAX_ENTRIES, IN_MEMORY, History, HistoryEntry, HistoryError, Outcome
from dictation.config.journal import FILE_NAME, Journal, Record, replay

log = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 1.0  # a write waits this long for another program's lock, then goes to the journal
RETRY_MS = 3000  # while anything waits in the journal (or in memory), the database is tried this often
_ERRORS = (sqlite3.Error, HistoryError, OSError)


@dataclass(frozen=True)
class RecoveredTake:
    """A take a crash interrupted before it was transcribed: its entry and its audio (16 kHz)."""

    entry_id: int
    samples: np.ndarray
    path: Path


class HistoryWorker(QObject):
    """Owns the history's write connection. ``opener() -> History`` (tests inject failures there)."""

    ready = Signal(int, bool)  # take id, durable: the take's entry (or its journal record) exists
    stored = Signal(int, bool)  # take id, durable: its text is in the history or the journal
    changed = Signal()  # the history's rows changed
    recovered = Signal(object)  # list[RecoveredTake]
    problem = Signal(str, str)  # level ("info", "warning", "error"), message for the user
    corrected = Signal(int, str)  # entry id, "" when the user's text is saved, else why not

    def __init__(
        self,
        path: Path | str,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        *,
        journal_path: Path | str | None = None,
        opener: Any = None,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self._max_entries = max_entries
        self._opener = opener or (lambda: History(self.path, self._max_entries, busy_timeout_s=BUSY_TIMEOUT_S))
        self.journal = Journal(journal_path if journal_path is not None else self.path.with_name(FILE_NAME))
        self._db: History | None = None
        self._takes: dict[int, Record] = {}  # take id -> its entry, while the take is under way
        self._recovering: dict[int, Record] = {}  # entry id -> a recovered take being transcribed
        self._my_ids: set[int] = set()  # entries of this run's takes (not crash leftovers)
        self._my_keys: set[str] = set()
        self._aside = False  # records wait in the journal: every write goes there until replayed
        self._unsaved: dict[str, Record] = {}  # neither the database nor the journal took them
        self._recovery_done = False
        self._trouble: str | None = None  # the failure the user was told about, until it is over
        self._retry = QTimer(self)  # a child: it moves to the worker's thread with it
        self._retry.setSingleShot(True)
        self._retry.timeout.connect(self._settle)

    # ---- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def for_history(cls, history: Any, max_entries: int) -> HistoryWorker:
        """A worker writing to ``history``'s file on its own connection; where the history lives in
        memory (its file could not be opened), the worker writes into that same in-memory history, its
        journal goes to the data folder (never the working directory), and no recording is pruned."""
        if str(history.path) != IN_MEMORY:
            return cls(history.path, max_entries=max_entries)
        from dictation import paths

        return cls(
            history.path, max_entries=max_entries, journal_path=paths.data_dir() / FILE_NAME, opener=lambda: history
        )

    @Slot()
    def open(self) -> None:
        """Connect, replay the journal, find the takes a crash interrupted (on the worker's thread)."""
        try:
            self._aside = self.journal.exists()
        except OSError as exc:
            log.warning("cannot read %s: %s", self.journal.path, exc)
        self._settle()

    @Slot()
    def drain(self) -> None:
        """Nothing: a blocking call of it returns once every request queued before it is done."""

    @Slot()
    def close(self) -> None:
        self._retry.stop()
        if self._unsaved:
            log.error(
                "%d dictation(s) could not be written to the history or to %s before quitting",
                len(self._unsaved),
                self.journal.path,
            )
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None

    # ---- the takes of this run ------------------------------------------------------------------

    @Slot(int, object)
    def begin_take(self, take_id: int, audio_path: Any) -> None:
        record = Record(
            key=uuid.uuid4().hex,
            created=datetime.now(timezone.utc),
            fields={"text": "", "audio_path": _path_text(audio_path), "outcome": Outcome.PENDING},
        )
        self._takes[take_id] = record
        self._my_keys.add(record.key)
        durable = self._save(record)
        self.ready.emit(take_id, durable)

    @Slot(int, object)
    def store_text(self, take_id: int, fields: dict) -> None:
        """The take's transcript (and language, timings ...): stored before it is typed."""
        record = self._take(take_id)
        record.fields.update(_clean(fields))
        record.fields["outcome"] = Outcome.PENDING
        durable = self._save(record)
        self.stored.emit(take_id, durable)
        self.changed.emit()

    @Slot(int, object, bool, int)
    def finish_take(self, take_id: int, fields: dict, delete_audio: bool, keep: int) -> None:
        """The take's last change (its outcome, or why it was not transcribed)."""
        record = self._takes.pop(take_id, None) or self._take(take_id, keep_it=False)
        record.fields.update(_clean(fields))
        if delete_audio and self._delete_audio(record.fields.get("audio_path")):
            record.fields["audio_path"] = None
        self._save(record)
        self.changed.emit()
        self._prune(record.fields.get("audio_path"), keep)

    @Slot(int, bool, int)
    def discard_take(self, take_id: int, delete_audio: bool, keep: int) -> None:
        """The take ended without text to keep (cancelled, too short, no speech): no entry."""
        record = self._takes.pop(take_id, None)
        if record is None:
            return
        record.deleted = True
        audio = record.fields.get("audio_path")
        if delete_audio:
            self._delete_audio(audio)
        self._save(record)
        self.changed.emit()
        self._prune(audio, keep)

    def _take(self, take_id: int, keep_it: bool = True) -> Record:
        record = self._takes.get(take_id)
        if record is None:  # no begin_take (cannot happen in the app; be safe): a new entry
            record = Record(key=uuid.uuid4().hex, created=datetime.now(timezone.utc), fields={"text": ""})
            self._my_keys.add(record.key)
            if keep_it:
                self._takes[take_id] = record
        return record

    # ---- entries by id (history window, re-transcription, recovery) ----------------------------

    @Slot(int, object)
    def update_entry(self, entry_id: int, fields: dict) -> None:
        """A re-transcription's text; a recovered take's text and outcome (journalled if need be)."""
        record = self._recovering.pop(entry_id, None)
        if record is not None:
            audio = record.fields.get("audio_path")
            record.fields.update(_clean(fields))
            if audio and record.fields.get("audio_path") is None:  # recordings are not kept (keep 0)
                self._delete_audio(audio)
            if not record.fields.get("text", "").strip() and record.fields.get("outcome") == Outcome.RECOVERED:
                record.deleted = True  # nothing was said: like a live take without speech
            self._save(record)
            self.changed.emit()
            return
        if self._write(lambda db: db.update(entry_id, **_clean(fields)), "update an entry"):
            self.changed.emit()

    @Slot(int, str)
    def correct_entry(self, entry_id: int, text: str) -> None:
        """The user's own text for an entry (`History.correct`): tried once, answered through
        ``corrected`` so the history window can say why it was not saved and keep the text."""
        error = ""
        if not self._connect():
            error = "the history cannot be opened now"
        else:
            try:
                if not self._db.correct(entry_id, text):
                    error = "this dictation is no longer in the history"
            except ValueError as exc:  # empty text, or a take still being transcribed
                error = str(exc)
            except _ERRORS as exc:
                log.warning("history: could not save a correction: %s", exc)
                self._reset_if_broken(exc)
                error = _reason(exc)
        if not error:
            self.changed.emit()
        self.corrected.emit(entry_id, error)

    @Slot(int)
    def delete_entry(self, entry_id: int) -> None:
        if self._write(lambda db: db.delete(entry_id), "delete the entry"):
            self.changed.emit()

    @Slot(int)
    def set_max_entries(self, value: int) -> None:
        self._max_entries = value

        def apply(db: History) -> None:
            db.max_entries = value

        if self._write(apply, "apply the new history size"):
            self.changed.emit()

    def _write(self, change: Any, what: str) -> bool:
        """A change that is not a dictation (the window's edits): tried once, the user told if it fails."""
        if not self._connect():
            self.problem.emit("warning", f"Could not {what}: the history cannot be opened now.")
            return False
        try:
            change(self._db)
        except _ERRORS as exc:
            log.warning("history: could not %s: %s", what, exc)
            self.problem.emit("warning", f"Could not {what}: {_reason(exc)}. Try again later.")
            return False
        return True

    # ---- writing a dictation's entry --------------------------------------------------------------

    def _save(self, record: Record) -> bool:
        """Write ``record`` to the database, else to the journal, else keep it in memory; True when
        it is on disk (database or journal)."""
        if not self._aside and not self._unsaved and self._connect():
            try:
                self._apply(record)
                return True
            except _ERRORS as exc:
                self._failed(exc)
                self._reset_if_broken(exc)
        return self._put_aside(record)

    def _apply(self, record: Record) -> None:
        db = self._db
        if record.deleted:
            if record.entry_id is not None:
                db.delete(record.entry_id)
        elif record.entry_id is None:
            record.entry_id = db.add(created=record.created, **record.fields)
            if record.key in self._my_keys:
                self._my_ids.add(record.entry_id)
        elif not db.update(record.entry_id, **record.fields):
            log.info("history entry %d was deleted meanwhile; not written again", record.entry_id)

    def _put_aside(self, record: Record) -> bool:
        self._retry_later()
        try:
            self.journal.append(record)
        except OSError as exc:
            self._unsaved[record.key] = record
            log.error("history: cannot write %s either: %s", self.journal.path, exc)
            self._tell(
                "error",
                f"The dictation could not be saved: neither the history nor {self.journal.path} can be "
                f"written ({_reason(exc)}). Its text is kept in memory and saved as soon as the disk "
                "accepts it; if the app quits before that, only what was typed remains.",
                key="memory",
            )
            return False
        self._aside = True
        self._unsaved.pop(record.key, None)
        return True

    def _settle(self) -> None:
        """Replay what waits (journal, memory) into the database, then recover crashed takes once."""
        if not self._connect():
            self._retry_later()
            return
        if self._aside or self._unsaved:
            try:
                records = self.journal.records() if self._aside else []
            except OSError as exc:
                log.warning("cannot read %s: %s", self.journal.path, exc)
                self._retry_later()
                return
            records += self._unsaved.values()  # after the file's: where a key is in both, these are newer
            try:
                ids = replay(self._db, records)
            except _ERRORS as exc:
                log.info("history still unavailable (%s); trying again in %d s", exc, RETRY_MS // 1000)
                self._reset_if_broken(exc)
                self._retry_later()
                return
            for record in [*self._takes.values(), *self._recovering.values()]:
                if record.key in ids and ids[record.key] is not None:
                    record.entry_id = ids[record.key]
            self._my_ids.update(i for k, i in ids.items() if k in self._my_keys and i is not None)
            self._unsaved.clear()
            self._aside = False
            try:
                self.journal.clear()
            except OSError as exc:  # replaying it again later changes nothing
                log.warning("cannot delete %s after adding it to the history: %s", self.journal.path, exc)
            kept = [r for r in records if not r.deleted]
            log.info("history: %d record(s) kept aside were added", len(kept))
            if kept:
                self.changed.emit()
            if self._trouble is not None or kept:
                self._trouble = None
                self.problem.emit(
                    "info", f"The history works again; {len(kept)} dictation(s) kept aside meanwhile are now in it."
                )
        self._trouble = None
        if not self._recovery_done:
            self._recover()

    def _connect(self) -> bool:
        if self._db is not None:
            return True
        try:
            self._db = self._opener()
        except _ERRORS as exc:
            self._failed(exc)
            return False
        return True

    def _reset_if_broken(self, exc: BaseException) -> None:
        """Reconnect at the next try after any error but another program's lock (a full disk, an
        I/O error, a damaged file may leave the connection unusable)."""
        text = str(exc).lower()
        if "locked" in text or "busy" in text:
            return
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()

    def _failed(self, exc: BaseException) -> None:
        log.warning("history write failed: %s", exc)
        self._tell(
            "warning",
            f"The history cannot be written now ({_reason(exc)}). Dictations are still typed, and kept in "
            f"{self.journal.path} until the history works again.",
            key="db",
        )

    def _tell(self, level: str, message: str, key: str) -> None:
        if self._trouble == key:
            return
        self._trouble = key
        self.problem.emit(level, message)

    def _retry_later(self) -> None:
        if not self._retry.isActive():
            self._retry.start(RETRY_MS)

    # ---- recordings -------------------------------------------------------------------------------

    def _delete_audio(self, audio: Any) -> bool:
        if not audio:
            return False
        try:
            Path(audio).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot delete recording %s: %s", audio, exc)
            return False
        return True

    def _prune(self, audio: Any, keep: int) -> None:
        """Keep the newest ``keep`` recordings in the take's folder, and those of pending and corrected entries."""
        from dictation.audio.recordings import prune_recordings

        if not audio or keep < 1 or self._aside or self._unsaved or str(self.path) == IN_MEMORY or not self._connect():
            # without the database's word on what is pending (an in-memory history knows only this
            # session's takes), nothing is deleted
            return
        try:
            protect = self._db.kept_audio()
        except _ERRORS as exc:
            log.info("recordings not pruned: %s", exc)
            return
        for record in [*self._takes.values(), *self._recovering.values()]:
            if record.fields.get("audio_path"):
                protect.add(Path(record.fields["audio_path"]))
        for path in prune_recordings(keep, directory=Path(audio).parent, protect=protect):
            log.debug("deleted old recording %s", path)

    # ---- recovery ---------------------------------------------------------------------------------

    def _recover(self) -> None:
        """Takes a crash left pending (not this run's): failed if their audio is gone, else read
        and handed on to be transcribed."""
        from dictation.asr.errors import AudioError
        from dictation.audio.wav import load_audio_16k

        try:
            entries = [e for e in self._db.pending_takes() if e.id not in self._my_ids]
        except _ERRORS as exc:
            log.info("looking for interrupted dictations failed (%s); trying again later", exc)
            self._retry_later()
            return
        self._recovery_done = True
        found = []
        for entry in entries:
            record = _record_of(entry)
            path = entry.audio_path
            if path is None or not path.is_file():
                record.fields["outcome"] = Outcome.failed(
                    "the app stopped before this dictation was transcribed, and its recording was not kept"
                )
                self._save(record)
                continue
            try:
                samples = load_audio_16k(path)
            except AudioError as exc:
                if _nothing_recorded(path):  # the app stopped right at the press
                    record.deleted = True
                    self._delete_audio(path)
                else:
                    record.fields["outcome"] = Outcome.failed(f"the app stopped before it was transcribed; {exc}")
                self._save(record)
                continue
            record.fields["duration_s"] = len(samples) / 16_000
            self._recovering[entry.id] = record
            found.append(RecoveredTake(entry.id, samples, path))
        if entries:
            self.changed.emit()
        if found:
            log.info("found %d dictation(s) interrupted when the app last stopped", len(found))
            self.recovered.emit(found)


def _record_of(entry: HistoryEntry) -> Record:
    return Record(
        key=f"entry-{entry.id}",
        created=entry.created,
        entry_id=entry.id,
        fields={
            "text": entry.text,
            "language": entry.language,
            "duration_s": entry.duration_s,
            "model_label": entry.model_label,
            "audio_path": _path_text(entry.audio_path),
            "outcome": entry.outcome,
            "timings": entry.timings,
            "streamed": entry.streamed,
            "corrected": entry.corrected,
            "raw_text": entry.raw_text,
        },
    )


def _nothing_recorded(path: Path) -> bool:
    try:
        return path.stat().st_size <= 44  # a WAV header and no samples
    except OSError:
        return False


def _path_text(path: Any) -> str | None:
    return None if path is None else str(path)


def _clean(fields: dict) -> dict:
    return {k: (_path_text(v) if k == "audio_path" else v) for k, v in fields.items()}


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
