"""Every term the model is given, in a table that says where each came from (typed by the user, or learned
from the correction of which dictation), each with a Remove button. The editor of
``transcription.learned_words``; it shows the user's typed terms too (`set_context`), and asks the page to
take one out of the text with ``typed_removed(term)``."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QPushButton, QTableWidget, QTableWidgetItem, QWidget

from dictation.app.widgets.fields import FieldEditor, fit_table_height
from dictation.config.schema import FieldInfo
from dictation.config.settings import LearnedWord
from dictation.vocabulary import learned_source, typed_terms

TYPED_SOURCE = "Typed by you (above)"
COLUMNS = ("Word", "From", "")
COL_WORD, COL_SOURCE, COL_REMOVE = range(len(COLUMNS))


class VocabularyTable(FieldEditor):
    typed_removed = Signal(str)

    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(info, parent)
        self._learned: tuple[LearnedWord, ...] = ()
        self._context = ""
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(COL_WORD, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(COL_SOURCE, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(COL_REMOVE, QHeaderView.ResizeMode.ResizeToContents)
        self._add(self.table)
        self._fill()

    # --- FieldEditor ------------------------------------------------------------------------------

    def value(self) -> tuple[LearnedWord, ...]:
        return self._learned

    def set_value(self, value: Any) -> None:
        self._learned = tuple(value)
        self._fill()

    def set_context(self, context: str) -> None:
        """The user's own vocabulary text, whose terms are listed first."""
        self._context = context
        self._fill()

    # --- what is shown ----------------------------------------------------------------------------

    def words(self) -> list[tuple[str, str]]:
        """(word, where it came from) per row, as shown."""
        return [
            (self.table.item(row, COL_WORD).text(), self.table.item(row, COL_SOURCE).text())
            for row in range(self.table.rowCount())
        ]

    def remove_button(self, word: str) -> QPushButton:
        for row in range(self.table.rowCount()):
            if self.table.item(row, COL_WORD).text() == word:
                return self.table.cellWidget(row, COL_REMOVE)
        raise KeyError(word)

    def _fill(self) -> None:
        rows = [(term, TYPED_SOURCE, None) for term in typed_terms(self._context)]
        rows += [(w.word, learned_source(w), w) for w in self._learned]
        self.table.clearContents()  # the old rows' buttons too
        self.table.setRowCount(len(rows))
        for row, (word, source, learned) in enumerate(rows):
            self.table.setItem(row, COL_WORD, QTableWidgetItem(word))
            item = QTableWidgetItem(source)
            item.setToolTip(source)
            self.table.setItem(row, COL_SOURCE, item)
            button = QPushButton("Remove")
            button.setToolTip(f"Remove “{word}” from the vocabulary.")
            button.clicked.connect(lambda _=False, word=word, learned=learned: self._remove(word, learned))
            self.table.setCellWidget(row, COL_REMOVE, button)
        fit_table_height(self.table, max_rows=12)

    def _remove(self, word: str, learned: LearnedWord | None) -> None:
        if learned is None:
            self.typed_removed.emit(word)
        else:
            self.committed.emit(tuple(w for w in self._learned if w is not learned))
