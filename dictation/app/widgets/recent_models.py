"""The model folders and files chosen before (``engine.recent_models``): Use one again, or Forget it.

Like the adapter list, the widget shows the settings and reports each edit as the whole new tuple
through ``committed``; Use is a request to the page (``use_requested(path)``), which checks the
folder before choosing it. The row of the model in use says so; a folder that is gone is shown as
such (it may be on a drive that is not plugged in) and can only be forgotten.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QToolButton,
    QWidget,
)

from dictation.app.widgets.fields import FieldEditor, fit_table_height, style_as_help
from dictation.config.schema import FieldInfo
from dictation.config.settings import RecentModel

COL_PATH, COL_USE, COL_FORGET = range(3)


class RecentModelsList(FieldEditor):
    use_requested = Signal(str)

    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(info, parent)
        self._recent: tuple[RecentModel, ...] = ()
        self._current = ""
        self.table = QTableWidget(0, 3)
        self.table.horizontalHeader().hide()
        self.table.verticalHeader().hide()
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.table.setShowGrid(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(COL_PATH, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(COL_USE, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(COL_FORGET, QHeaderView.ResizeMode.ResizeToContents)
        self._add(self.table)
        self.empty = QLabel("None yet: folders chosen with Browse… are listed here.")
        style_as_help(self.empty)
        self._add(self.empty)
        self.rebuild()

    # --- FieldEditor ------------------------------------------------------------------------------

    def value(self) -> tuple[RecentModel, ...]:
        return self._recent

    def set_value(self, value: Any) -> None:
        value = tuple(value)
        if value != self._recent:
            self._recent = value
            self.rebuild()

    def set_current(self, spec: str) -> None:
        """Mark the row of the model in use (``engine.model``)."""
        if spec != self._current:
            self._current = spec
            self.rebuild()

    # --- user actions -----------------------------------------------------------------------------

    def forget(self, index: int) -> None:
        self.committed.emit(self._recent[:index] + self._recent[index + 1 :])

    def use(self, index: int) -> None:
        self.use_requested.emit(self._recent[index].path)

    def button(self, index: int, column: int) -> Any:
        return self.table.cellWidget(index, column)

    # --- building ---------------------------------------------------------------------------------

    def rebuild(self) -> None:
        """Show the list again (folders may have appeared or gone since)."""
        self.table.setRowCount(len(self._recent))
        for i, entry in enumerate(self._recent):
            exists = Path(entry.path).exists()
            in_use = entry.path == self._current
            text = entry.path if exists else f"{entry.path} (not found)"
            item = QTableWidgetItem(text)
            item.setFlags(Qt.ItemFlag.ItemIsEnabled)
            item.setToolTip(entry.path if exists else f"{entry.path} does not exist (any more, or not now)")
            self.table.setItem(i, COL_PATH, item)
            use = QPushButton("In use" if in_use else "Use")
            use.setEnabled(exists and not in_use)
            use.clicked.connect(lambda _checked=False, index=i: self.use(index))
            self.table.setCellWidget(i, COL_USE, use)
            forget = QToolButton()
            forget.setText("Forget")
            forget.setToolTip("Remove it from this list (the folder itself stays).")
            forget.clicked.connect(lambda _checked=False, index=i: self.forget(index))
            self.table.setCellWidget(i, COL_FORGET, forget)
        fit_table_height(self.table, min_rows=1, max_rows=6)
        self.table.setVisible(bool(self._recent))
        self.empty.setVisible(not self._recent)
