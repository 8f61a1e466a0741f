"""Combo and spin boxes that the mouse wheel changes only when the user means it.

Qt's own combo and spin boxes take the wheel whenever the pointer is over them, and take the focus
from it too. In a scrolling settings page that turns scrolling into editing: the pointer passes
over a combo box and the wheel that was moving the page changes the weights variant instead, once
per notch (and the model reloads each time).

The classes here are the only combo and spin boxes the app uses (a test checks). They take the
focus by click and Tab only (``Qt.StrongFocus``, not ``Qt.WheelFocus``), and while they do not have
the focus they ignore the wheel, so Qt hands it to their parents: the page's scroll area scrolls
(or an inner scroll area, such as a table, while it still can). Once the user has clicked or tabbed
into one, the wheel steps through its values as usual.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QSpinBox, QWidget


def takes_wheel(widget: QWidget) -> bool:
    """Whether ``widget`` should act on a wheel event now: only while it has the keyboard focus."""
    return widget.hasFocus()


class _WheelWhenFocused:
    """Mixed in before the Qt class: focus by click and Tab only, the wheel only while focused."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)

    def wheelEvent(self, event: QWheelEvent) -> None:
        if takes_wheel(self):
            super().wheelEvent(event)
        else:
            event.ignore()  # goes on to the parent: the page scrolls


class ComboBox(_WheelWhenFocused, QComboBox):
    pass


class SpinBox(_WheelWhenFocused, QSpinBox):
    pass


class DoubleSpinBox(_WheelWhenFocused, QDoubleSpinBox):
    pass
