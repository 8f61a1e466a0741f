"""The replacements table: "replace" / "with" pairs, applied in order to every transcript; and the same
table for the user's voice-command phrases (`PhrasesEditor`: "when I say" / "it means").

A row counts once its "Replace" cell has text; a new, still empty row stays in the table (greyed
hint in the status line) without being applied, so adding a row never produces an invalid setting.
Edits are reported as the whole new tuple through ``committed``.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from dictation.app.widgets.fields import FieldEditor, fit_table_height, style_as_help
from dictation.config.schema import FieldInfo
from dictation.config.settings import Phrase, Replacement

ORIGINAL = Qt.ItemDataRole.UserRole + 1  # the Replacement a row was built from (keeps its extra keys)


class ReplacementsEditor(FieldEditor):
    ITEM: type = Replacement  # a row is one of these, its two cells these two fields
    FIELDS = ("from_", "to")
    EMPTY = "No replacements. Add one to fix a word the model keeps getting wrong."
    PENDING = "Rows with an empty 'Replace' cell are not used until you fill it in."
    FILLED = "Applied in order, case-sensitive. Double-click a cell to edit it."

    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(info, parent)
        labels = [f.label for f in info.item_fields] or ["Replace", "With"]
        self.table = QTableWidget(0, 2)
        self.table.setHorizontalHeaderLabels(labels)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(
            QAbstractItemView.EditTrigger.DoubleClicked
            | QAbstractItemView.EditTrigger.EditKeyPressed
            | QAbstractItemView.EditTrigger.AnyKeyPressed
        )
        self.table.itemChanged.connect(self._on_item_changed)
        self._add(self.table)
        self.status = QLabel()
        style_as_help(self.status)
        self._add(self.status)
        buttons = QWidget()
        row = QHBoxLayout(buttons)
        row.setContentsMargins(0, 0, 0, 0)
        self.add_button = QPushButton("Add")
        self.add_button.clicked.connect(self.add_row)
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self.remove_selected)
        row.addWidget(self.add_button)
        row.addWidget(self.remove_button)
        row.addStretch(1)
        self._add(buttons)
        self._update_status()

    # --- FieldEditor ------------------------------------------------------------------------------

    def value(self) -> tuple[Any, ...]:
        out = []
        first, second = self.FIELDS
        for i in range(self.table.rowCount()):
            source = self._text(i, 0)
            if not source:
                continue
            values = {first: source, second: self._text(i, 1)}
            original = self.table.item(i, 0).data(ORIGINAL) if self.table.item(i, 0) else None
            out.append(original.replace(**values) if isinstance(original, self.ITEM) else self.ITEM(**values))
        return tuple(out)

    def set_value(self, value: Any) -> None:
        value = tuple(value)
        if value == self.value():
            return  # keeps rows the user is still filling in
        self.table.blockSignals(True)
        self.table.setRowCount(0)
        for item in value:
            self._append(getattr(item, self.FIELDS[0]), getattr(item, self.FIELDS[1]), item)
        self.table.blockSignals(False)
        self._update_status()

    # --- user actions -----------------------------------------------------------------------------

    def add_row(self) -> None:
        self.table.blockSignals(True)
        self._append("", "", None)
        self.table.blockSignals(False)
        row = self.table.rowCount() - 1
        self.table.setCurrentCell(row, 0)
        self.table.editItem(self.table.item(row, 0))
        self._update_status()

    def remove_selected(self) -> None:
        rows = sorted({index.row() for index in self.table.selectionModel().selectedRows()}, reverse=True)
        if not rows and self.table.currentRow() >= 0:
            rows = [self.table.currentRow()]
        if not rows:
            return
        before = self.value()
        for row in rows:
            self.table.removeRow(row)
        self._update_status()
        if self.value() != before:
            self.committed.emit(self.value())

    def set_cell(self, row: int, column: int, text: str) -> None:
        """Put ``text`` in a cell as typing it would."""
        self.table.item(row, column).setText(text)

    # --- helpers ----------------------------------------------------------------------------------

    def _append(self, source: str, target: str, original: Any) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        first = QTableWidgetItem(source)
        first.setData(ORIGINAL, original)
        self.table.setItem(row, 0, first)
        self.table.setItem(row, 1, QTableWidgetItem(target))

    def _text(self, row: int, column: int) -> str:
        item = self.table.item(row, column)
        return item.text() if item is not None else ""

    def _on_item_changed(self, item: QTableWidgetItem) -> None:
        self._update_status()
        self.committed.emit(self.value())

    def _update_status(self) -> None:
        fit_table_height(self.table, min_rows=3, max_rows=10)
        pending = sum(1 for i in range(self.table.rowCount()) if not self._text(i, 0))
        if pending:
            self.status.setText(self.PENDING)
        elif self.table.rowCount() == 0:
            self.status.setText(self.EMPTY)
        else:
            self.status.setText(self.FILLED)


class PhrasesEditor(ReplacementsEditor):
    """The user's own phrases for voice commands and punctuation ("When I say" / "It means")."""

    ITEM = Phrase
    FIELDS = ("said", "means")
    EMPTY = "No phrases of your own. Add one to say a command or a mark your way, e.g. 'next line' / 'new line'."
    PENDING = "Rows with an empty 'When I say' cell are not used until you fill it in."
    FILLED = (
        "Case does not matter. 'It means' a command (new line, new paragraph, press enter, tab, scratch that) "
        "or a mark."
    )
