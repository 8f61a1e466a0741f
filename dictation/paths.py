"""Where the app keeps its files (platformdirs), overridable with DICTATION_HOME for tests.

- config: settings.json
- data:   history.sqlite3, recordings/
- log:    dictation.log

All of them are private to the user (folders 0700, files 0600): see `dictation.private`.
"""

from __future__ import annotations

import os
from pathlib import Path

APP_NAME = "dictation"
LOG_FILE = "dictation.log"
CRASH_FILE = "crash.log"  # Python's stacks if the app dies of a fatal signal (app/logs.py)
LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"  # the app's log file and stderr


def _base(kind: str) -> Path:
    override = os.environ.get("DICTATION_HOME")
    if override:
        return Path(override) / kind
    import platformdirs

    getter = {
        "config": platformdirs.user_config_dir,
        "data": platformdirs.user_data_dir,
        "log": platformdirs.user_log_dir,
    }[kind]
    return Path(getter(APP_NAME, appauthor=False))


def config_dir() -> Path:
    return _base("config")


def data_dir() -> Path:
    return _base("data")


def log_dir() -> Path:
    return _base("log")


def log_file() -> Path:
    return log_dir() / LOG_FILE


def recordings_dir() -> Path:
    return data_dir() / "recordings"


def private_folders() -> list[Path]:
    """The app's own folders, everything in them private (`dictation.private`): config, data (with
    the recordings) and log. Where the log folder sits in a folder of the app's own
    (``~/.local/state/dictation/log``), that folder is listed instead."""
    folders = [config_dir(), data_dir(), log_dir()]
    return [f.parent if f.parent.name == APP_NAME and f.name != APP_NAME else f for f in folders]
