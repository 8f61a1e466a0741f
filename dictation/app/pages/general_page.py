"""The General page: startup, the indicator, history and recordings, model memory, and global hotkeys."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from dictation.app.pages import SettingsPage
from dictation.app.widgets.fields import WrappedLabel, fields_of, info_for
from dictation.config.settings import Settings

STARTUP = ("general.start_at_login", "general.show_overlay", "general.live_preview")
STORAGE = ("general.history_size", "general.keep_recordings")


class GeneralPage(SettingsPage):
    name = "general"
    title = "General"

    def __init__(self, controller: Any, parent: QWidget | None = None):
        super().__init__(controller, parent)
        startup = self.add_group("Startup and display", [info_for(key) for key in STARTUP])
        self.add_group("History and recordings", [info_for(key) for key in STORAGE])
        startup.add_fields(fields_of("general", set(STARTUP) | set(STORAGE)))  # fields added later land here
        self.add_group("Model memory", [info_for("engine.idle_unload_minutes")])
        keys = self.add_group("Global hotkeys", [info_for("hotkeys.backend")])
        self.hotkey_backend = WrappedLabel()
        self.hotkey_backend.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        keys.add_widget("In use", self.hotkey_backend)
        self.finish()

    def refresh(self, settings: Settings) -> None:
        super().refresh(settings)
        self.hotkey_backend.setText(self.controller.hotkey_description())
