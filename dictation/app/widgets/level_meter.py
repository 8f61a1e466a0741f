"""A horizontal input-level bar, 0..1: green while the level is comfortable, amber when loud, red near clipping."""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPalette
from PySide6.QtWidgets import QSizePolicy, QWidget

LOUD = 0.75
CLIPPING = 0.92


class LevelMeter(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._level = 0.0
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setAccessibleName("Microphone level")

    def level(self) -> float:
        return self._level

    def set_level(self, level: float) -> None:
        level = min(1.0, max(0.0, float(level)))
        if level != self._level:
            self._level = level
            self.update()

    def sizeHint(self) -> QSize:
        return QSize(240, 14)

    def minimumSizeHint(self) -> QSize:
        return QSize(60, 10)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        palette = self.palette()
        painter.setPen(palette.color(QPalette.ColorRole.Mid))
        painter.setBrush(palette.color(QPalette.ColorRole.Base))
        painter.drawRoundedRect(rect, 3, 3)
        if self._level > 0:
            filled = QRectF(rect.x() + 1, rect.y() + 1, (rect.width() - 2) * self._level, rect.height() - 2)
            if self._level >= CLIPPING:
                color = QColor("#d32f2f")
            elif self._level >= LOUD:
                color = QColor("#f9a825")
            else:
                color = QColor("#43a047")
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(color)
            painter.drawRoundedRect(filled, 2, 2)
        painter.end()
