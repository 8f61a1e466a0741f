"""The Output page: how text reaches the focused window (with the tool chain detected for this desktop),
clipboard handling, the text clean-ups (trailing space, capitalisation, replacements) and voice commands
(spoken punctuation, the user's own phrases)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QWidget

from dictation.app.pages import SettingsPage
from dictation.app.widgets.fields import WrappedLabel, fields_of, info_for
from dictation.app.widgets.replacements import PhrasesEditor, ReplacementsEditor
from dictation.config.settings import Settings

TEXT_FIELDS = ("output.trailing_space", "output.capitalize_first", "output.replacements")


class OutputPage(SettingsPage):
    name = "output"
    title = "Output"

    def __init__(self, controller: Any, parent: QWidget | None = None):
        super().__init__(controller, parent)
        insert = self.add_group("Inserting text")
        insert.add_field(info_for("output.method"))
        self.detected = WrappedLabel()
        self.detected.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.detected.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        insert.add_widget("Detected", self.detected)
        insert.add_fields(fields_of("output", set(TEXT_FIELDS) | {"output.method"}))

        text = self.add_group("Text")
        text.add_fields([info_for(key) for key in TEXT_FIELDS if key != "output.replacements"])
        replacements = info_for("output.replacements")
        self.replacements_row = text.add_field(replacements, ReplacementsEditor(replacements))
        self.replacements: ReplacementsEditor = self.replacements_row.editor

        voice = self.add_group("Voice commands")
        voice.add_fields([info_for("commands.enabled"), info_for("commands.spoken_punctuation")])
        phrases = info_for("commands.phrases")
        self.phrases: PhrasesEditor = voice.add_field(phrases, PhrasesEditor(phrases)).editor
        self.finish()

    def refresh(self, settings: Settings) -> None:
        super().refresh(settings)
        self.detected.setText(self.controller.output_description())
