"""The Vocabulary page: the user's own vocabulary text, what happens to new words in corrections, and every
term the model is given with where it came from and a Remove button (`VocabularyTable`). The context
built from them: `dictation.vocabulary.model_context`."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QWidget

from dictation.app.pages import SettingsPage
from dictation.app.widgets.fields import WrappedLabel, info_for, style_as_help
from dictation.app.widgets.vocabulary_table import VocabularyTable
from dictation.config.settings import Settings
from dictation.vocabulary import learned_left_out, model_context, remove_typed_term


class VocabularyPage(SettingsPage):
    name = "vocabulary"
    title = "Vocabulary"

    def __init__(self, controller: Any, parent: QWidget | None = None):
        super().__init__(controller, parent)
        self.add_group("Your vocabulary", [info_for("transcription.context")])
        self.add_group("Learning from corrections", [info_for("transcription.learn_from_corrections")])
        given = self.add_group("What the model is given")
        info = info_for("transcription.learned_words")
        self.table_row = given.add_field(info, VocabularyTable(info), show_help=False, span=True)
        self.table: VocabularyTable = self.table_row.editor
        self.table.typed_removed.connect(self.remove_typed)
        self.summary = WrappedLabel()
        style_as_help(self.summary)
        given.add_widget("", self.summary)
        self.finish()

    def refresh(self, settings: Settings) -> None:
        super().refresh(settings)
        transcription = settings.transcription
        self.table.set_context(transcription.context)
        rows = self.table.table.rowCount()
        context = model_context(transcription)
        text = f"{rows} terms; the model is given {len(context):,} characters of context before each dictation."
        if left_out := learned_left_out(transcription):
            text += f" {left_out} learned words do not fit after your own text and are left out."
        self.summary.setText(text if rows else "No vocabulary yet: the model is given no context.")

    def remove_typed(self, term: str) -> None:
        """Take ``term`` out of the user's own text, the rest as written."""
        settings = self.controller.settings
        t = settings.transcription
        self.apply(settings.replace(transcription=t.replace(context=remove_typed_term(t.context, term))))
