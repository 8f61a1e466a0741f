"""The history database's table: its columns, the migrations that bring an older file up to them
(`MIGRATIONS`, run by `history.History` when it opens a file), and how a row's timings are read,
version 1's streamed flag inside them included."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable


# MIGRATIONS[n] upgrades a database at user_version n to n + 1 (0 is a new, empty file).
def _create_v1(conn: sqlite3.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE dictations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, so a held id never names another row
            created TEXT NOT NULL,                 -- UTC, ISO 8601
            text TEXT NOT NULL,
            language TEXT,
            duration_s REAL,
            model_label TEXT,
            audio_path TEXT,
            outcome TEXT NOT NULL DEFAULT 'pending',
            timings TEXT                           -- JSON object of seconds per stage
        )
        """
    )


def _add_streamed_v2(conn: sqlite3.Connection) -> None:
    """Whether a take was transcribed while it was recorded gets a column of its own. Version 1 kept it
    as ``"streamed": 1.0`` inside the timings; those rows are moved over (`legacy_streamed`)."""
    if "timings" not in {row[1] for row in conn.execute("PRAGMA table_info(dictations)")}:
        return  # not our table: `History._migrate` names the columns it lacks
    conn.execute("ALTER TABLE dictations ADD COLUMN streamed INTEGER NOT NULL DEFAULT 0")
    rows = conn.execute(f"SELECT id, timings FROM dictations WHERE timings LIKE '%\"{LEGACY_STREAMED}\"%'")
    for entry_id, text in rows.fetchall():
        timings, streamed = legacy_streamed(parse_timings(text))
        if streamed:
            sql = "UPDATE dictations SET streamed = 1, timings = ? WHERE id = ?"
            conn.execute(sql, (json.dumps(timings), entry_id))


def _add_corrected_v3(conn: sqlite3.Connection) -> None:
    """Entries whose text the user corrected get a flag: they and their recordings are kept for
    training a personal adapter (docs/app.md, step 7)."""
    if "timings" not in {row[1] for row in conn.execute("PRAGMA table_info(dictations)")}:
        return  # not our table: `History._migrate` names the columns it lacks
    conn.execute("ALTER TABLE dictations ADD COLUMN corrected INTEGER NOT NULL DEFAULT 0")


def _add_raw_text_v4(conn: sqlite3.Connection) -> None:
    """The transcript as the model wrote it, beside the text as typed (voice commands and text options
    applied); NULL for entries from before."""
    if "timings" not in {row[1] for row in conn.execute("PRAGMA table_info(dictations)")}:
        return  # not our table: `History._migrate` names the columns it lacks
    conn.execute("ALTER TABLE dictations ADD COLUMN raw_text TEXT")


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _create_v1,
    _add_streamed_v2,
    _add_corrected_v3,
    _add_raw_text_v4,
]
COLUMNS = (
    "id",
    "created",
    "text",
    "language",
    "duration_s",
    "model_label",
    "audio_path",
    "outcome",
    "timings",
    "streamed",
    "corrected",
    "raw_text",
)
LEGACY_STREAMED = "streamed"  # version 1's key for the flag inside the timings (1.0: streamed)


def parse_timings(text: str | None) -> dict[str, float] | None:
    try:
        timings = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    return timings if isinstance(timings, dict) else None


def legacy_streamed(timings: dict[str, float] | None) -> tuple[dict[str, float] | None, bool]:
    """``timings`` without version 1's streamed flag, and whether it was set."""
    if not timings or LEGACY_STREAMED not in timings:
        return timings, False
    rest = {k: v for k, v in timings.items() if k != LEGACY_STREAMED}
    return rest, bool(timings[LEGACY_STREAMED])
