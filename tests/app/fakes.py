"""`FakeController`: the app controller's interface for window tests, without engine, microphone or hotkeys.

Settings are real: ``apply_settings`` validates, saves with a real :class:`SettingsStore` and emits
``settings_changed`` as the app's controller does. The history is a real SQLite :class:`History`.
Everything the windows ask the controller to *do* is recorded in ``calls`` for the tests to check.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QGuiApplication

from dictation.app.personalise import Personaliser
from dictation.audio.devices import InputDevice
from dictation.config.history import History
from dictation.config.schema import FieldError, validate
from dictation.config.settings import Settings
from dictation.config.store import SettingsStore
from dictation.session import Status

DEVICES = [
    InputDevice(index=0, name="Built-in Microphone", default_samplerate=48000, channels=2, is_default=True),
    InputDevice(index=3, name="USB Headset", default_samplerate=16000, channels=1, is_default=False),
]


class FakeController(QObject):
    status_changed = Signal(object)
    settings_changed = Signal(object)
    model_label_changed = Signal(str)
    model_progress = Signal(str)
    history_changed = Signal()
    log_record = Signal(object)
    # bytes: a plain int would be a 32-bit C++ int and overflow past 2 GiB (a model is 4.7 GB)
    download_progress = Signal(str, "qlonglong", "qlonglong")
    download_finished = Signal(str, str)
    notified = Signal(str, str)
    quit_requested = Signal()
    input_level_changed = Signal(float)
    preview_changed = Signal(str)
    retranscribed = Signal(int, str)
    corrected = Signal(int, str)

    def __init__(self, folder: Path, settings: Settings | None = None):
        super().__init__()
        self.store = SettingsStore(Path(folder) / "settings.json")
        if settings is not None:
            self.store.save(settings)
        self._settings = self.store.load()
        self._history = History(Path(folder) / "history.sqlite3")
        self._status = Status.IDLE
        self._model_label = ""
        self.model_state_text = "Loaded" if self._settings.engine.model else "No speech model is chosen yet"
        self._paused = False
        self.level = 0.0
        self.level_polls = 0
        self.devices = list(DEVICES)
        self.log: list[logging.LogRecord] = []
        self.calls: list[tuple] = []
        self.applied: list[Settings] = []
        self.correct_fails = ""  # a reason makes correct_entry fail as the history worker would say it
        # The real Personaliser; tests give it a training function (``personaliser.train``) and samples.
        self.personaliser = Personaliser(self, adapters_dir=Path(folder) / "data" / "adapters")

    # --- properties -------------------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def history(self) -> History:
        return self._history

    @property
    def status(self) -> Status:
        return self._status

    @property
    def model_label(self) -> str:
        return self._model_label

    @property
    def hotkeys_paused(self) -> bool:
        return self._paused

    @property
    def preview_text(self) -> str:
        return ""

    # --- settings ---------------------------------------------------------------------------------

    def apply_settings(self, settings: Settings) -> list[FieldError]:
        self.applied.append(settings)
        errors = validate(settings)
        if errors:
            return errors
        self.store.save(settings)
        self._settings = settings
        self.settings_changed.emit(settings)
        return []

    def saved_settings(self) -> Settings:
        """What a restarted app would read from disk."""
        return SettingsStore(self.store.path).load()

    # --- what the windows show --------------------------------------------------------------------

    def input_level(self) -> float:
        self.level_polls += 1
        return self.level

    def input_devices(self) -> list[InputDevice]:
        return list(self.devices)

    def hotkey_description(self) -> str:
        return f"pynput (X11 session; chosen for backend {self._settings.hotkeys.backend!r})"

    def output_description(self) -> str:
        return f"method {self._settings.output.method}: xdotool paste\nfallback: clipboard only"

    def recent_log(self) -> list[logging.LogRecord]:
        return list(self.log)

    # --- actions ----------------------------------------------------------------------------------

    def toggle(self) -> None:
        self.calls.append(("toggle",))

    def set_hotkeys_paused(self, paused: bool) -> None:
        self.calls.append(("set_hotkeys_paused", paused))
        self._paused = paused

    def copy_entry(self, entry_id: int) -> bool:
        self.calls.append(("copy_entry", entry_id))
        entry = self._history.get(entry_id)
        if entry is not None:
            QGuiApplication.clipboard().setText(entry.text)
        return entry is not None

    def retype_entry(self, entry_id: int) -> None:
        self.calls.append(("retype_entry", entry_id))

    def delete_entry(self, entry_id: int) -> None:
        self.calls.append(("delete_entry", entry_id))
        self._history.delete(entry_id)
        self.history_changed.emit()

    def correct_entry(self, entry_id: int, text: str) -> None:
        """Like the app's: saved with History.correct, answered through ``corrected`` (queued there too)."""
        self.calls.append(("correct_entry", entry_id))
        error = self.correct_fails
        if not error:
            try:
                if not self._history.correct(entry_id, text):
                    error = "this dictation is no longer in the history"
            except ValueError as exc:
                error = str(exc)
        if not error:
            self.history_changed.emit()
        QTimer.singleShot(0, lambda: self.corrected.emit(entry_id, error))

    def retranscribe_entry(self, entry_id: int) -> None:
        self.calls.append(("retranscribe_entry", entry_id))

    def start_download(self, repo_id: str) -> None:
        self.calls.append(("start_download", repo_id))

    def cancel_download(self) -> None:
        self.calls.append(("cancel_download",))

    # --- test helpers -----------------------------------------------------------------------------

    def set_model_label(self, label: str) -> None:
        self._model_label = label
        self.model_label_changed.emit(label)

    def change_settings_elsewhere(self, settings: Settings) -> None:
        """Settings changed by something other than the window (the tray, a download)."""
        self.store.save(settings)
        self._settings = settings
        self.settings_changed.emit(settings)

    def called(self, name: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == name]

    def close(self) -> None:
        self.personaliser.shutdown()
        self._history.close()
