"""Settings (typed, frozen, JSON under the config folder) and the dictation history (SQLite).

Qt-free, and light to import: nothing here imports torch (the language list is read from the
engine only when a non-default language is checked or offered).
"""

from typing import TYPE_CHECKING, Any

from dictation.config.schema import FieldError, FieldInfo, Problem, field_info, from_dict, to_dict, validate
from dictation.config.settings import (
    SCHEMA_VERSION,
    Adapter,
    EngineSettings,
    GeneralSettings,
    HotkeySettings,
    OutputSettings,
    RecentModel,
    RecordingSettings,
    Replacement,
    Settings,
    TranscriptionSettings,
    language_choices,
)
from dictation.config.store import LoadReport, SettingsError, SettingsStore, atomic_write

if TYPE_CHECKING:
    from dictation.config.history import History, HistoryEntry, HistoryError, Outcome

_HISTORY = ("History", "HistoryEntry", "HistoryError", "Outcome")


def __getattr__(name: str) -> Any:
    """The history (and sqlite3) is imported on first use: the app reads its settings in its first
    moment, before the hotkey is grabbed (dictation.launch), and the history only later."""
    if name in _HISTORY:
        from dictation.config import history

        return getattr(history, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCHEMA_VERSION",
    "Adapter",
    "EngineSettings",
    "FieldError",
    "FieldInfo",
    "GeneralSettings",
    "History",
    "HistoryEntry",
    "HistoryError",
    "HotkeySettings",
    "LoadReport",
    "Outcome",
    "OutputSettings",
    "Problem",
    "RecentModel",
    "RecordingSettings",
    "Replacement",
    "Settings",
    "SettingsError",
    "SettingsStore",
    "TranscriptionSettings",
    "atomic_write",
    "field_info",
    "from_dict",
    "language_choices",
    "to_dict",
    "validate",
]
