"""Editors generated from the settings metadata (:func:`dictation.config.schema.field_info`).

Each setting gets a :class:`FieldEditor` chosen by its kind (a check box, a spin box with limits and
unit, a combo box of choices, an editable combo for open choices, a line or a multi-line text), and a
:class:`FieldRow` around it with the help text and a place for an error message. A
:class:`FieldGroup` lays rows out as a form.

Editors report an edit the user *finished* through ``committed(value)``: on Enter or focus-out for
text, after a short pause in typing for multi-line text, at once for check boxes and lists. Setting a
value from the program (:meth:`FieldEditor.set_value`) never emits it, so refreshing a form from new
settings cannot loop back into another change.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSizePolicy,
    QSpinBox,
    QTableWidget,
    QVBoxLayout,
    QWidget,
)

from dictation.app.widgets.wheel import ComboBox, DoubleSpinBox, SpinBox
from dictation.config.schema import FieldInfo, field_info

# A row that only matters while another (bool) setting is on is greyed out while it is off.
DEPENDS_ON: dict[str, str] = {
    "recording.sound_volume": "recording.sounds",
    "output.restore_delay_ms": "output.restore_clipboard",
    "general.live_preview": "engine.stream_while_recording",  # previews come from the streamed audio
}

# What a spin box shows at its minimum when that value means something special.
SPECIAL_VALUE_TEXT: dict[str, str] = {"engine.idle_unload_minutes": "Never (keep it loaded)"}

MULTILINE_DEBOUNCE_MS = 1000
ERROR_STYLE = "color: #c62828;"

_INT_LIMIT = 2**31 - 1


class WrappedLabel(QLabel):
    """A word-wrapped label whose size hint is its height at its current width.

    A plain word-wrapped QLabel guesses its height for a narrow width; inside a scroll area (which
    ignores height-for-width) the guess is kept and leaves gaps. This one reports its real height
    and asks for a new layout when its width changes.
    """

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(text, parent)
        self.setWordWrap(True)

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        if self.width() > 0:
            return QSize(hint.width(), self.heightForWidth(self.width()))
        return hint

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        if self.width() > 0:
            return QSize(hint.width(), self.heightForWidth(self.width()))
        return hint

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self.updateGeometry()


def style_as_help(label: QLabel) -> None:
    """Smaller, dimmer text for explanations under a control."""
    palette = label.palette()
    palette.setColor(QPalette.ColorRole.WindowText, palette.color(QPalette.ColorRole.PlaceholderText))
    label.setPalette(palette)
    font = label.font()
    font.setPointSizeF(font.pointSizeF() * 0.9)
    label.setFont(font)


def fit_table_height(table: QTableWidget, min_rows: int = 1, max_rows: int = 8) -> None:
    """Make ``table`` as tall as its rows (within limits) instead of a fixed, mostly empty box."""
    row_height = table.verticalHeader().defaultSectionSize()
    rows = min(max(table.rowCount(), min_rows), max_rows)
    frame = 2 * table.frameWidth()
    table.setFixedHeight(table.horizontalHeader().sizeHint().height() + rows * row_height + frame)


def info_for(key: str) -> FieldInfo:
    """The FieldInfo with dotted ``key`` ("output.paste_chord")."""
    for info in field_info():
        if info.key == key:
            return info
    raise KeyError(key)


def fields_of(group: str, exclude: set[str] | frozenset[str] = frozenset()) -> list[FieldInfo]:
    """The fields of settings group ``group`` in declaration order, without the keys in ``exclude``."""
    return [info for info in field_info() if info.group == group and info.key not in exclude]


class FieldEditor(QWidget):
    """Base of every settings editor: ``value()``, ``set_value()`` (silent) and ``committed(value)``."""

    committed = Signal(object)

    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(parent)
        self.info = info
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setToolTip(info.help)

    def value(self) -> Any:
        raise NotImplementedError

    def set_value(self, value: Any) -> None:
        raise NotImplementedError

    def _add(self, widget: QWidget) -> QWidget:
        self._layout.addWidget(widget)
        return widget


class BoolEditor(FieldEditor):
    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(info, parent)
        self.check = self._add(QCheckBox(info.label))
        self.check.toggled.connect(lambda on: self.committed.emit(bool(on)))

    def value(self) -> bool:
        return self.check.isChecked()

    def set_value(self, value: Any) -> None:
        self.check.blockSignals(True)
        self.check.setChecked(bool(value))
        self.check.blockSignals(False)


class IntEditor(FieldEditor):
    """A spin box within the field's limits; applies on Enter, focus-out and the arrows (not per digit)."""

    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(info, parent)
        self.spin = self._make_spin()
        self.spin.setKeyboardTracking(False)
        self.spin.setRange(*self._range())
        if info.unit:
            self.spin.setSuffix(f" {info.unit}")
        if info.key in SPECIAL_VALUE_TEXT:
            self.spin.setSpecialValueText(SPECIAL_VALUE_TEXT[info.key])
        self.spin.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.spin.setMinimumWidth(160)
        self._add(self.spin)
        self.spin.valueChanged.connect(lambda v: self.committed.emit(self.value()))

    def _make_spin(self) -> QSpinBox | QDoubleSpinBox:
        return SpinBox()

    def _range(self) -> tuple[Any, Any]:
        lo = -_INT_LIMIT if self.info.minimum is None else int(self.info.minimum)
        hi = _INT_LIMIT if self.info.maximum is None else int(self.info.maximum)
        return lo, hi

    def value(self) -> Any:
        return int(self.spin.value())

    def set_value(self, value: Any) -> None:
        if self.spin.value() == value:
            return
        self.spin.blockSignals(True)
        self.spin.setValue(value)
        self.spin.blockSignals(False)


class FloatEditor(IntEditor):
    def _make_spin(self) -> QDoubleSpinBox:
        spin = DoubleSpinBox()
        spin.setDecimals(2)
        spin.setSingleStep(0.1)
        return spin

    def _range(self) -> tuple[Any, Any]:
        lo = -1e9 if self.info.minimum is None else float(self.info.minimum)
        hi = 1e9 if self.info.maximum is None else float(self.info.maximum)
        return lo, hi

    def value(self) -> float:
        return float(self.spin.value())


class ChoiceEditor(FieldEditor):
    """A closed list: the labels are shown, the values are stored."""

    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(info, parent)
        self.combo = self._add(ComboBox())
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.combo.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        for value, label in info.choices or ():
            self.combo.addItem(label, value)
        self.combo.activated.connect(lambda index: self.committed.emit(self.combo.itemData(index)))

    def value(self) -> Any:
        return self.combo.currentData()

    def set_value(self, value: Any) -> None:
        index = self.combo.findData(value)
        self.combo.blockSignals(True)
        if index < 0:  # a value this version does not offer (written by a newer one): show it as is
            self.combo.addItem(str(value), value)
            index = self.combo.count() - 1
        self.combo.setCurrentIndex(index)
        self.combo.blockSignals(False)

    def set_item_labels(self, labels: dict[Any, str]) -> None:
        """Rename items (e.g. to add how much memory each variant needs)."""
        for i in range(self.combo.count()):
            label = labels.get(self.combo.itemData(i))
            if label is not None:
                self.combo.setItemText(i, label)


class OpenChoiceEditor(FieldEditor):
    """Suggestions plus free text (device "cuda:1", an output tool by name); the value is the text."""

    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(info, parent)
        self.combo = self._add(ComboBox())
        self.combo.setEditable(True)
        self.combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.combo.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.combo.setMinimumWidth(180)
        for value, label in info.choices or ():
            self.combo.addItem(value, value)
            self.combo.setItemData(self.combo.count() - 1, label, Qt.ItemDataRole.ToolTipRole)
        if info.pattern_help:
            self.combo.lineEdit().setPlaceholderText(info.pattern_help)
        self.combo.activated.connect(lambda index: self.committed.emit(self.value()))
        self.combo.lineEdit().editingFinished.connect(lambda: self.committed.emit(self.value()))

    def value(self) -> str:
        return self.combo.currentText().strip()

    def set_value(self, value: Any) -> None:
        if self.combo.currentText() == value:
            return
        self.combo.blockSignals(True)
        self.combo.lineEdit().blockSignals(True)
        self.combo.setEditText(str(value))
        self.combo.lineEdit().blockSignals(False)
        self.combo.blockSignals(False)


class TextEditor(FieldEditor):
    """One line; applies on Enter and focus-out."""

    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(info, parent)
        self.edit = self._add(QLineEdit())
        if info.max_length:
            self.edit.setMaxLength(info.max_length)
        if info.pattern_help:
            self.edit.setPlaceholderText(info.pattern_help)
        self.edit.editingFinished.connect(lambda: self.committed.emit(self.value()))

    def value(self) -> str:
        return self.edit.text()

    def set_value(self, value: Any) -> None:
        if self.edit.text() == value:
            return
        self.edit.blockSignals(True)
        self.edit.setText(str(value))
        self.edit.blockSignals(False)


class MultilineEditor(FieldEditor):
    """Several lines; applies a moment after typing stops and on focus-out, never per keystroke."""

    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(info, parent)
        self.edit = self._add(QPlainTextEdit())
        self.edit.setTabChangesFocus(True)
        self.edit.setMinimumHeight(90)
        self.edit.setMaximumHeight(140)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(MULTILINE_DEBOUNCE_MS)
        self._timer.timeout.connect(self._flush)
        self.edit.textChanged.connect(self._timer.start)
        self.edit.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.edit and event.type() == QEvent.Type.FocusOut and self._timer.isActive():
            self._flush()
        return False

    def _flush(self) -> None:
        self._timer.stop()
        self.committed.emit(self.value())

    def value(self) -> str:
        return self.edit.toPlainText()

    def set_value(self, value: Any) -> None:
        if self.edit.toPlainText() == value:
            return  # keeps the cursor where the user is typing
        self.edit.blockSignals(True)
        self.edit.setPlainText(str(value))
        self.edit.blockSignals(False)


def make_editor(info: FieldInfo, parent: QWidget | None = None) -> FieldEditor:
    """The generated editor for ``info``; list fields have hand-built editors and raise ValueError."""
    if info.kind == "bool":
        return BoolEditor(info, parent)
    if info.kind == "int":
        return IntEditor(info, parent)
    if info.kind == "float":
        return FloatEditor(info, parent)
    if info.kind == "choice":
        return ChoiceEditor(info, parent)
    if info.kind == "str":
        if info.choices:
            return OpenChoiceEditor(info, parent)
        if info.multiline:
            return MultilineEditor(info, parent)
        return TextEditor(info, parent)
    raise ValueError(f"{info.key}: no generated editor for {info.kind!r} fields")


class FieldRow(QWidget):
    """An editor with its help text below it and an error message that appears when an edit is refused."""

    def __init__(self, editor: FieldEditor, parent: QWidget | None = None, *, show_help: bool = True):
        super().__init__(parent)
        self.info = editor.info
        self.editor = editor
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(editor)
        self.help = WrappedLabel(editor.info.help)
        self.help.setVisible(show_help)
        style_as_help(self.help)
        layout.addWidget(self.help)
        self.error = WrappedLabel()
        self.error.setStyleSheet(ERROR_STYLE)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error.hide()
        layout.addWidget(self.error)
        layout.addStretch(1)  # spare height (word-wrapped help is measured generously) goes below the row

    @property
    def key(self) -> str:
        return self.info.key

    def show_error(self, message: str) -> None:
        self.error.setText(message)
        self.error.show()

    def clear_error(self) -> None:
        self.error.clear()
        self.error.hide()

    def error_text(self) -> str:
        return self.error.text() if not self.error.isHidden() else ""


class FieldGroup(QGroupBox):
    """A titled form of settings rows. ``committed(info, value)`` when the user finished an edit."""

    committed = Signal(object, object)

    def __init__(self, title: str, parent: QWidget | None = None):
        super().__init__(title, parent)
        self.form = QFormLayout(self)
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.DontWrapRows)
        self.form.setLabelAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop)
        self.rows: dict[str, FieldRow] = {}

    def add_field(
        self, info: FieldInfo, editor: FieldEditor | None = None, *, show_help: bool = True, span: bool = False
    ) -> FieldRow:
        """A row for ``info`` (generated editor unless one is given); ``span``: no label, full width."""
        editor = editor or make_editor(info)
        row = FieldRow(editor, show_help=show_help)
        editor.committed.connect(lambda value, info=info: self.committed.emit(info, value))
        if span:
            self.form.addRow(row)
        elif isinstance(editor, BoolEditor):
            # an explicit empty label: with addRow("", ...) Qt sizes the row by its width-less guess
            self.form.addRow(QLabel(), row)
        else:
            label = QLabel(info.label + ":")
            label.setToolTip(info.help)
            label.setBuddy(editor)
            self.form.addRow(label, row)
        self.rows[info.key] = row
        return row

    def add_fields(self, infos: list[FieldInfo]) -> None:
        for info in infos:
            self.add_field(info)

    def add_widget(self, label: str, widget: QWidget) -> None:
        self.form.addRow(QLabel(label + ":" if label else ""), widget)

    def set_settings(self, settings: Any) -> None:
        for key, row in self.rows.items():
            row.editor.set_value(row.info.get(settings))
            depends = DEPENDS_ON.get(key)
            if depends is not None:
                row.setEnabled(bool(info_for(depends).get(settings)))
