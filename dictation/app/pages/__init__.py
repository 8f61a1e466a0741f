"""The pages of the settings window, and what they share: :class:`SettingsPage`.

A page shows some settings as :class:`~dictation.app.widgets.fields.FieldGroup` forms, generated
from the settings metadata where it fits. Changes apply live: every finished edit builds a new
``Settings`` and hands it to ``controller.apply_settings``. Refused fields get their message under the
editor (matched by dotted key) and the editors go back to the current settings. When settings change
(this page, another page, a download), ``controller.settings_changed`` refreshes every editor; editors
update silently, so a refresh never triggers another change.
"""

from __future__ import annotations

import re
from typing import Any

from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from dictation.app.widgets.fields import ERROR_STYLE, FieldGroup, FieldRow, WrappedLabel, style_as_help
from dictation.config.schema import FieldError, FieldInfo, from_dict, to_dict
from dictation.config.settings import Settings


def normalized(settings: Settings) -> Settings:
    """``settings`` with values written the way they are stored ("CUDA:1" -> "cuda:1", "German" -> "de").

    The validator refuses values that are fine but not in their stored form; the loader knows how to
    normalise them, so a round trip through it does the job. With any unusable value the settings
    are returned unchanged, for the validator to name the problem.
    """
    fixed, problems = from_dict(Settings, to_dict(settings))
    return settings if problems else fixed


def describe_error(error: FieldError, row_key: str) -> str:
    """The message for a row: "'gpu' is not ..." or, inside a list, "Item 2, weight: 5.0 is out of range"."""
    rest = error.key[len(row_key) :]
    match = re.fullmatch(r"\[(\d+)\]\.?(\w*)", rest)
    if match:
        index, name = int(match[1]) + 1, match[2].rstrip("_")
        return f"Item {index}, {name}: {error.message}" if name else f"Item {index}: {error.message}"
    return error.message


class SettingsPage(QWidget):
    """Base of the settings pages. Subclasses build their groups, then call :meth:`finish`."""

    name = ""
    title = ""

    def __init__(self, controller: Any, parent: QWidget | None = None):
        super().__init__(parent)
        self.controller = controller
        self.groups: list[FieldGroup] = []
        self._layout = QVBoxLayout(self)
        heading = QLabel(self.title)
        font = heading.font()
        font.setPointSizeF(font.pointSizeF() * 1.4)
        font.setBold(True)
        heading.setFont(font)
        self._layout.addWidget(heading)
        self.message = WrappedLabel()
        self.message.setStyleSheet(ERROR_STYLE)
        self.message.hide()
        self._layout.addWidget(self.message)
        controller.settings_changed.connect(self.refresh)

    # --- building ---------------------------------------------------------------------------------

    def add_widget(self, widget: QWidget) -> QWidget:
        self._layout.addWidget(widget)
        return widget

    def add_group(self, title: str, infos: list[FieldInfo] = ()) -> FieldGroup:
        group = FieldGroup(title)
        group.committed.connect(self.commit)
        group.add_fields(list(infos))
        self._layout.addWidget(group)
        self.groups.append(group)
        return group

    def add_note(self, group: FieldGroup, text: str) -> QLabel:
        label = WrappedLabel(text)
        style_as_help(label)
        group.add_widget("", label)
        return label

    def finish(self) -> None:
        self._layout.addStretch(1)
        self.refresh(self.controller.settings)

    # --- rows and errors --------------------------------------------------------------------------

    @property
    def rows(self) -> dict[str, FieldRow]:
        """Every settings row on this page by dotted key."""
        out: dict[str, FieldRow] = {}
        for group in self.groups:
            out.update(group.rows)
        return out

    def row_for_key(self, key: str) -> FieldRow | None:
        """The row showing ``key`` or the list that contains it ("engine.adapters[0].weight")."""
        rows = self.rows
        if key in rows:
            return rows[key]
        for row_key, row in rows.items():
            if key.startswith((row_key + "[", row_key + ".")):
                return row
        return None

    def show_errors(self, errors: list[FieldError]) -> None:
        unplaced = []
        for error in errors:
            row = self.row_for_key(error.key)
            if row is None:
                unplaced.append(str(error))
            else:
                row.show_error(describe_error(error, row.key))
        if unplaced:
            self.message.setText("Not applied: " + "; ".join(unplaced))
            self.message.show()

    def clear_errors(self) -> None:
        for row in self.rows.values():
            row.clear_error()
        self.message.clear()
        self.message.hide()

    # --- applying ---------------------------------------------------------------------------------

    def commit(self, info: FieldInfo, value: Any) -> None:
        """The user finished editing ``info``: apply the new value if it differs."""
        current = self.controller.settings
        if info.get(current) != value:
            self.apply(info.set(current, value))

    def apply(self, settings: Settings) -> list[FieldError]:
        """Apply ``settings`` through the controller; on refusal show why and show the current values."""
        settings = normalized(settings)
        if settings == self.controller.settings:
            self.refresh(settings)
            return []
        errors = self.controller.apply_settings(settings)
        if errors:
            self.show_errors(errors)
            self.refresh(self.controller.settings)
        else:
            self.clear_errors()
        return errors

    def refresh(self, settings: Settings) -> None:
        """Show ``settings`` (called on every settings_changed); subclasses extend it."""
        for group in self.groups:
            group.set_settings(settings)
