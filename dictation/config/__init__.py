"""Settings (typed, frozen, JSON under the config folder) and the dictation history (SQLite).

Qt-free, and light to import: nothing here imports torch (the language list is read from the
engine only when a non-default language is checked or offered).
"""

from dictation.config.history import History, HistoryEntry, HistoryError, Outcome
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
