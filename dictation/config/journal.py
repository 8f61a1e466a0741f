"""Where a dictation goes when the history database cannot take it: a file replayed into it later.

The history is written from a worker thread with a short lock timeout. When a write fails (the
database locked by another program, the disk full, an I/O error), the app does not wait and does
not drop the text: it appends the entry as one JSON line to this journal (fsynced, mode 0600)
beside the database and types the text at once. Each line is the whole entry as it should end up
in the history (``key`` names the dictation; the last line of a key wins), so replaying the file
is `History.restore` per key, and replaying it twice changes nothing. The app replays it every few
seconds while it is not empty and at every start, then deletes it.

A line that cannot be parsed (a crash while it was written: only the last line can be torn, since
every line is flushed and fsynced before the next) is skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FILE_NAME = "history-unsaved.jsonl"


@dataclass
class Record:
    """One dictation's entry as it should end up in the history."""

    key: str  # unique per dictation (or "entry-<id>" for an entry the app already had)
    created: datetime
    entry_id: int | None = None  # its row, if it has one
    fields: dict[str, Any] = field(default_factory=dict)  # History field name -> value
    deleted: bool = False  # the entry should not exist (a cancelled take)

    def to_json(self) -> str:
        fields = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.fields.items()}
        return json.dumps(
            {
                "key": self.key,
                "created": self.created.isoformat(),
                "entry_id": self.entry_id,
                "fields": fields,
                "deleted": self.deleted,
            },
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, line: str) -> Record:
        data = json.loads(line)
        return cls(
            key=str(data["key"]),
            created=datetime.fromisoformat(data["created"]),
            entry_id=data.get("entry_id"),
            fields=dict(data.get("fields") or {}),
            deleted=bool(data.get("deleted")),
        )


class Journal:
    """The fallback file for one history database."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def exists(self) -> bool:
        return self.path.is_file() and self.path.stat().st_size > 0

    def append(self, record: Record) -> None:
        """Add ``record`` durably (written and fsynced when this returns); OSError names the file."""
        data = (record.to_json() + "\n").encode("utf-8")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise OSError(exc.errno, f"{self.path}: {exc.strerror or exc}") from None

    def records(self) -> list[Record]:
        """The newest record of each key, in the order the keys first appeared."""
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        latest: dict[str, Record] = {}
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = Record.from_json(line)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("%s, line %d: skipped, not a complete record (%s)", self.path, number, exc)
                continue
            latest[record.key] = record
        return list(latest.values())

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def replay(history: Any, records: list[Record]) -> dict[str, int | None]:
    """Bring ``history`` to the given records (`History.restore` each, or delete); key -> entry id.

    Raises what the history raises (sqlite3.Error, HistoryError): the caller keeps the records
    and tries again later. Records already applied are applied again harmlessly.
    """
    ids: dict[str, int | None] = {}
    for record in records:
        if record.deleted:
            if record.entry_id is not None:
                history.delete(record.entry_id)
            ids[record.key] = None
            continue
        ids[record.key] = history.restore(record.entry_id, record.created, **record.fields)
    return ids
