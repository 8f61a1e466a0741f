"""The LoRA adapter list: add a folder, switch adapters on and off, set their weight, remove them.

The widget shows ``engine.adapters`` and reports every edit as the whole new tuple through
``committed``; it never changes itself. The page checks new or re-enabled adapters before applying,
and the list follows the settings once they are saved (or stays as it was when they are refused).
An adapter Personalise trained has its figures (before and after, on held-out dictations) in its tooltip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QToolButton,
    QWidget,
)

from dictation.app.personalise import adapter_summary
from dictation.app.widgets.fields import FieldEditor, fit_table_height, info_for, style_as_help
from dictation.app.widgets.wheel import DoubleSpinBox
from dictation.config.schema import FieldInfo
from dictation.config.settings import Adapter

COL_FOLDER, COL_WEIGHT, COL_REMOVE = range(3)


class AdapterList(FieldEditor):
    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(info, parent)
        self._adapters: tuple[Adapter, ...] = ()
        self._weight_info = info_for_item("weight")
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["Adapter folder (tick to enable)", "Weight", ""])
        self.table.verticalHeader().hide()
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(COL_FOLDER, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(COL_WEIGHT, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(COL_REMOVE, QHeaderView.ResizeMode.ResizeToContents)
        self.table.itemChanged.connect(lambda item: self.committed.emit(self.value()))
        self._add(self.table)
        self.empty = QLabel("No adapters. An adapter must be trained on the model chosen above.")
        style_as_help(self.empty)
        self._add(self.empty)
        buttons = QWidget()
        row = QHBoxLayout(buttons)
        row.setContentsMargins(0, 0, 0, 0)
        self.add_button = QPushButton("Add adapter folder…")
        self.add_button.clicked.connect(self.choose_folder)
        row.addWidget(self.add_button)
        row.addStretch(1)
        self._add(buttons)
        self._rebuild()

    # --- FieldEditor ------------------------------------------------------------------------------

    def value(self) -> tuple[Adapter, ...]:
        out = []
        for i, adapter in enumerate(self._adapters):
            item = self.table.item(i, COL_FOLDER)
            spin = self.table.cellWidget(i, COL_WEIGHT)
            enabled = item.checkState() == Qt.CheckState.Checked if item is not None else adapter.enabled
            weight = float(spin.value()) if isinstance(spin, QDoubleSpinBox) else adapter.weight
            if enabled != adapter.enabled or weight != adapter.weight:
                adapter = adapter.replace(enabled=enabled, weight=weight)
            out.append(adapter)
        return tuple(out)

    def set_value(self, value: Any) -> None:
        value = tuple(value)
        if value == self._adapters and value == self.value():
            return
        self._adapters = value
        self._rebuild()

    # --- user actions -----------------------------------------------------------------------------

    def choose_folder(self) -> None:
        start = str(Path(self._adapters[-1].path).parent) if self._adapters else str(Path.home())
        folder = QFileDialog.getExistingDirectory(self, "Choose a LoRA adapter folder", start)
        if folder:
            self.add_folder(folder)

    def add_folder(self, folder: str | Path) -> None:
        """Ask for ``folder`` to be appended (the page checks it first)."""
        self.committed.emit(self._adapters + (Adapter(path=str(folder)),))

    def remove(self, index: int) -> None:
        self.committed.emit(self._adapters[:index] + self._adapters[index + 1 :])

    def set_enabled(self, index: int, enabled: bool) -> None:
        """Tick or untick row ``index`` as a click would."""
        self.table.item(index, COL_FOLDER).setCheckState(Qt.CheckState.Checked if enabled else Qt.CheckState.Unchecked)

    # --- building ---------------------------------------------------------------------------------

    def _rebuild(self) -> None:
        self.table.blockSignals(True)
        self.table.setRowCount(len(self._adapters))
        for i, adapter in enumerate(self._adapters):
            item = QTableWidgetItem(adapter.path)
            item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if adapter.enabled else Qt.CheckState.Unchecked)
            summary = adapter_summary(adapter.path)  # a personal adapter: its before/after figures
            item.setToolTip(adapter.path + (f"\n{summary}" if summary else ""))
            self.table.setItem(i, COL_FOLDER, item)
            spin = DoubleSpinBox()
            spin.setRange(self._weight_info.minimum or 0.0, self._weight_info.maximum or 2.0)
            spin.setSingleStep(0.1)
            spin.setDecimals(2)
            spin.setKeyboardTracking(False)
            spin.setValue(adapter.weight)
            spin.setToolTip(self._weight_info.help)
            spin.valueChanged.connect(lambda _v: self.committed.emit(self.value()))
            self.table.setCellWidget(i, COL_WEIGHT, spin)
            remove = QToolButton()
            remove.setText("Remove")
            remove.clicked.connect(lambda _checked=False, index=i: self.remove(index))
            self.table.setCellWidget(i, COL_REMOVE, remove)
        self.table.blockSignals(False)
        fit_table_height(self.table, min_rows=1, max_rows=6)
        self.table.setVisible(bool(self._adapters))
        self.empty.setVisible(not self._adapters)


def info_for_item(name: str) -> FieldInfo:
    """The FieldInfo of one field of an adapter entry (its limits and help)."""
    return next(f for f in info_for("engine.adapters").item_fields if f.name == name)
