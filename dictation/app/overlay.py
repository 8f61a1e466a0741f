"""A small always-on-top indicator while recording (with a level meter) and transcribing.

It must never take the keyboard focus: the text is pasted into whatever window has it (a
focus-taking overlay breaks pasting; Handy turns its overlay off on Linux for that reason). So the
window is a frameless tool window that does not accept focus, is shown without activation and lets
mouse input through. On Wayland a client can neither place such a window nor be sure the
compositor will not focus it (that needs layer-shell), so there it stays off and the log says so.

With live preview on, a second line under the level meter shows what the engine has heard so far
(the controller's `preview_changed`), elided from the left so the newest words stay in view. It is
only a preview: the typed text is the final transcript. Where there is no overlay the tray's
tooltip carries it instead (`overlay_in_use`).
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QPoint, QRectF, Qt
from PySide6.QtGui import QColor, QCursor, QFontMetrics, QGuiApplication, QPainter
from PySide6.QtWidgets import QWidget

from dictation.app.controller import AppController
from dictation.config import Settings
from dictation.session import Status

log = logging.getLogger(__name__)

WIDTH, HEIGHT = 180, 34
PREVIEW_WIDTH, PREVIEW_HEIGHT = 440, 58  # with a line of live preview text under the meter
MARGIN = 48  # above the bottom edge of the screen with the mouse pointer


def overlay_supported() -> tuple[bool, str]:
    platform = QGuiApplication.platformName()
    if platform.startswith("wayland"):
        return False, "Wayland does not let an app place a window that never takes focus"
    if platform in ("offscreen", "minimal"):
        return False, f"the {platform} platform has no screen"
    return True, ""


def overlay_in_use(settings: Settings) -> bool:
    """Whether the overlay shows (and so carries the live preview) with these settings here."""
    return overlay_supported()[0] and bool(settings.general.show_overlay)


class Overlay(QWidget):
    def __init__(self, controller: AppController) -> None:
        flags = (
            Qt.WindowType.Tool
            | Qt.WindowType.FramelessWindowHint
            | Qt.WindowType.WindowStaysOnTopHint
            | Qt.WindowType.WindowDoesNotAcceptFocus
            | Qt.WindowType.WindowTransparentForInput
            | Qt.WindowType.X11BypassWindowManagerHint
        )
        super().__init__(None, flags)
        self.setAttribute(Qt.WidgetAttribute.WA_ShowWithoutActivating)
        self.setAttribute(Qt.WidgetAttribute.WA_TranslucentBackground)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.setWindowTitle("Dictation indicator")
        self.setFixedSize(WIDTH, HEIGHT)
        self.controller = controller
        self.status = Status.IDLE
        self.level = 0.0
        self.preview = ""
        self.supported, why = overlay_supported()
        if not self.supported and controller.settings.general.show_overlay:
            log.info("recording indicator off: %s", why)
        controller.status_changed.connect(self.on_status)
        controller.input_level_changed.connect(self.on_level)
        controller.preview_changed.connect(self.on_preview)
        controller.settings_changed.connect(self._on_settings)  # a lambda here would keep the controller alive

    def _on_settings(self, _settings: object) -> None:
        self.on_status(self.controller.status)

    def wanted(self, status: Status) -> bool:
        return (
            self.supported
            and self.controller.settings.general.show_overlay
            and status in (Status.RECORDING, Status.TRANSCRIBING)
        )

    def on_status(self, status: Status) -> None:
        self.status = status
        if self.wanted(status):
            if not self.isVisible():
                self._place()
                self.show()
            self.update()
        elif self.isVisible():
            self.hide()

    def on_level(self, level: float) -> None:
        self.level = max(0.0, min(1.0, level))
        if self.isVisible():
            self.update()

    def on_preview(self, text: str) -> None:
        self.preview = " ".join(text.split())
        size = (PREVIEW_WIDTH, PREVIEW_HEIGHT) if self.preview else (WIDTH, HEIGHT)
        if (self.width(), self.height()) != size:
            self.setFixedSize(*size)
            if self.isVisible():
                self._place()
        if self.isVisible():
            self.update()

    def preview_line(self) -> str:
        """The preview as drawn: elided at the left, so the newest words show."""
        if not self.preview:
            return ""
        return QFontMetrics(self.font()).elidedText(self.preview, Qt.TextElideMode.ElideLeft, self.width() - 32)

    def _place(self) -> None:
        screen = QGuiApplication.screenAt(QCursor.pos()) or QGuiApplication.primaryScreen()
        area = screen.availableGeometry()
        self.move(QPoint(area.center().x() - self.width() // 2, area.bottom() - self.height() - MARGIN))

    def paintEvent(self, event: object) -> None:  # noqa: N802 - Qt's name
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(QColor(24, 24, 27, 225))
        width, height = self.width(), self.height()
        radius = HEIGHT / 2 if height == HEIGHT else 14
        p.drawRoundedRect(QRectF(0, 0, width, height), radius, radius)
        recording = self.status is Status.RECORDING
        p.setBrush(QColor("#ef4444") if recording else QColor("#3b82f6"))
        p.drawEllipse(QRectF(12, HEIGHT / 2 - 6, 12, 12))
        p.setPen(QColor("#f4f4f5"))
        p.drawText(QRectF(32, 0, 86, HEIGHT), Qt.AlignmentFlag.AlignVCenter, "Recording" if recording else "Working…")
        if recording:
            bar = QRectF(120, HEIGHT / 2 - 4, 46, 8)
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(QColor(255, 255, 255, 50))
            p.drawRoundedRect(bar, 4, 4)
            p.setBrush(QColor("#22c55e"))
            p.drawRoundedRect(QRectF(bar.x(), bar.y(), bar.width() * self.level, bar.height()), 4, 4)
        line = self.preview_line()
        if line:
            p.setPen(QColor("#d4d4d8"))
            p.drawText(QRectF(16, HEIGHT - 6, width - 32, height - HEIGHT), Qt.AlignmentFlag.AlignVCenter, line)
        p.end()
