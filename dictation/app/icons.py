"""Tray and window icons, rendered from the packaged SVGs (one per tray state)."""

from __future__ import annotations

import functools
import logging
from importlib import resources

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer

from dictation.session import Status

log = logging.getLogger(__name__)

SIZES = (16, 22, 24, 32, 48, 64, 128)
# Drawn when an SVG is missing or unreadable, so a broken install still shows the state.
_FALLBACK_COLORS = {
    "idle": "#6b7280",
    "loading": "#d97706",
    "recording": "#dc2626",
    "transcribing": "#2563eb",
    "error": "#111827",
    "paused": "#37474f",
    "app": "#374151",
}


def _svg_bytes(name: str) -> bytes | None:
    try:
        return (resources.files("dictation.resources") / "icons" / f"{name}.svg").read_bytes()
    except (FileNotFoundError, ModuleNotFoundError, OSError) as exc:
        log.warning("icon %s.svg is missing from the package (%s); drawing a plain one", name, exc)
        return None


@functools.cache
def icon(name: str) -> QIcon:
    """The icon for a tray state ("idle", "loading", "recording", "transcribing", "error", "paused") or "app"."""
    data = _svg_bytes(name)
    renderer = QSvgRenderer(QByteArray(data)) if data else None
    if renderer is not None and not renderer.isValid():
        log.warning("icon %s.svg is not a valid SVG; drawing a plain one", name)
        renderer = None
    result = QIcon()
    for size in SIZES:
        pixmap = QPixmap(size, size)
        pixmap.fill(Qt.GlobalColor.transparent)
        painter = QPainter(pixmap)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        if renderer is not None:
            renderer.render(painter)
        else:
            painter.setBrush(QColor(_FALLBACK_COLORS.get(name, "#6b7280")))
            painter.setPen(Qt.PenStyle.NoPen)
            painter.drawEllipse(1, 1, size - 2, size - 2)
        painter.end()
        result.addPixmap(pixmap)
    return result


def status_icon(status: Status, paused: bool = False) -> QIcon:
    """The tray icon for ``status``; while the hotkeys are paused an idle app shows "paused"
    (loading, recording, transcribing and errors still show as such: they say more)."""
    return icon("paused" if paused and status is Status.IDLE else status.value)
