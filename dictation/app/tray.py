"""The tray icon and its menu; a small status window where the desktop has no system tray.

The icon follows the session's status (idle, loading, recording, transcribing, error); its tooltip
names the model and the hotkey, and carries the live preview while recording where no overlay can
show it (Wayland). A left click toggles dictation (like `dictation toggle`); the menu
has start/stop, the last transcripts (click copies), the model switcher, settings, history, pause
hotkeys and quit. Notifications from the controller appear as tray balloons.

Without a system tray (bare X servers, GNOME without the AppIndicator extension, Sway without a
status notifier host) the same menu lives on a small always-available window, and the log says why.
That window never takes the keyboard focus (see `dictation.app.focus`): dictated text goes to the
window the user was working in, and a click on its Menu button leaves the focus there too. Its width
is fixed (`STATUS_WIDTH`), so tiling compositors (Sway) float it instead of giving it half the
screen, and its height follows its last message. Its title is "<status> — Dictation": Qt appends the
application's display name to a title that does not end with it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QActionGroup, QGuiApplication
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMenu,
    QPushButton,
    QSystemTrayIcon,
    QVBoxLayout,
    QWidget,
)

from dictation.app.controller import AppController
from dictation.app.focus import keep_unfocused_on_map
from dictation.app.icons import icon, status_icon
from dictation.app.overlay import overlay_in_use
from dictation.session import Status

log = logging.getLogger(__name__)

RECENT_ITEMS = 5
TOOLTIP_PREVIEW_CHARS = 120  # the newest part of a live preview in the tooltip
STATUS_TEXT = {
    Status.IDLE: "Ready",
    Status.LOADING: "Loading the speech model…",
    Status.RECORDING: "Recording…",
    Status.TRANSCRIBING: "Transcribing…",
    Status.ERROR: "Speech model unavailable",
}
VARIANTS = (("auto", "Automatic precision"), ("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32"))
NO_MODEL_TEXT = "Choose a speech model"
APP_TITLE, TITLE_SEPARATOR = "Dictation", " — "  # the application's display name (dictation.app.main)
PAUSED_TEXT = "Ready (hotkeys paused)"
STATUS_WIDTH = 340  # fixed: Sway floats a window whose minimum and maximum widths are equal
_LEVEL_ICON = {
    "info": QSystemTrayIcon.MessageIcon.Information,
    "warning": QSystemTrayIcon.MessageIcon.Warning,
    "error": QSystemTrayIcon.MessageIcon.Critical,
}


def status_text(controller: AppController) -> str:
    """The status in words; the error of a new user who has no model yet says what to do."""
    if controller.status is Status.ERROR and not controller.settings.engine.model:
        return NO_MODEL_TEXT
    if controller.status is Status.IDLE and controller.hotkeys_paused:
        return PAUSED_TEXT
    return STATUS_TEXT[controller.status]


def window_title(status: str) -> str:
    """The status window's title, "Ready — Dictation" (ending with the display name, Qt adds nothing)."""
    return f"{status}{TITLE_SEPARATOR}{APP_TITLE}"


def status_title_pattern() -> str:
    """A regular expression for every title the status window can have (Sway's `no_focus` rule):
    "— Dictation" alone would match the other windows too ("Dictation settings — Dictation")."""
    texts = sorted({*STATUS_TEXT.values(), NO_MODEL_TEXT, PAUSED_TEXT})
    return f"^({'|'.join(map(re.escape, texts))}){re.escape(TITLE_SEPARATOR + APP_TITLE)}$"


def elide(text: str, width: int = 48) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


class TrayMenu(QMenu):
    """The menu, rebuilt from the controller's state each time it is about to show."""

    def __init__(
        self, controller: AppController, show_settings: Callable[[str], None], show_history: Callable[[], None]
    ):
        super().__init__()
        self.controller = controller
        self._show_settings = show_settings
        self._show_history = show_history
        self.aboutToShow.connect(self.rebuild)
        self.rebuild()

    def rebuild(self) -> None:
        c = self.controller
        self.clear()
        recording = c.status is Status.RECORDING
        toggle = self.addAction("Stop dictation" if recording else "Start dictation")
        toggle.triggered.connect(c.toggle)
        self.addSeparator()
        entries = [e for e in c.history.recent(RECENT_ITEMS * 2) if e.text.strip()][:RECENT_ITEMS]
        if entries:
            header = self.addAction("Recent (click to copy)")
            header.setEnabled(False)
            for entry in entries:
                action = self.addAction(elide(entry.text))
                action.setToolTip(entry.text)
                action.triggered.connect(lambda _=False, i=entry.id: c.copy_entry(i))
        else:
            empty = self.addAction("No dictations yet")
            empty.setEnabled(False)
        self.addSeparator()
        self.addMenu(self._model_menu())
        self.addAction("Settings…").triggered.connect(lambda: self._show_settings(""))
        self.addAction("History…").triggered.connect(self._show_history)
        pause = self.addAction("Pause hotkeys")
        pause.setCheckable(True)
        pause.setChecked(c.hotkeys_paused)
        pause.toggled.connect(c.set_hotkeys_paused)
        self.addSeparator()
        self.addAction("Quit").triggered.connect(c.quit_requested.emit)

    def _model_menu(self) -> QMenu:
        """The models on this computer (the Hugging Face cache, then the folders chosen before), the
        precision, and the Model page."""
        from dictation.asr.checkpoints.hub import KNOWN_MODELS, local_models

        c = self.controller
        menu = QMenu("Model", self)
        current = c.settings.engine.model
        label = c.model_label or ("not loaded" if current else "none chosen")
        info = menu.addAction(f"In use: {label}")
        info.setEnabled(False)
        models = local_models([r.path for r in c.settings.engine.recent_models])
        choices = [(m.spec, m.label, m.cached) for m in models]
        if current and current not in [spec for spec, _, _ in choices]:  # gone, or not downloaded yet
            known = {m.repo_id: m.label for m in KNOWN_MODELS}
            folder = Path(current).is_absolute()
            choices.insert(0, (current, known.get(current) or (Path(current).name if folder else current), not folder))
        group = QActionGroup(menu)
        for cached in (True, False):
            section = [(spec, text) for spec, text, in_cache in choices if in_cache is cached]
            if section:
                menu.addSection("Downloaded models" if cached else "Model folders")
            for spec, text in section:
                action = menu.addAction(text)
                action.setCheckable(True)
                action.setChecked(spec == current)
                action.setToolTip(spec)
                group.addAction(action)
                action.triggered.connect(lambda _=False, m=spec: self._choose_model(m))
        if not choices:
            menu.addSeparator()
            none = menu.addAction("No models yet — download one in Settings")
            none.setEnabled(False)
        menu.addSeparator()
        variants = QActionGroup(menu)
        for value, text in VARIANTS:
            action = menu.addAction(text)
            action.setCheckable(True)
            action.setChecked(c.settings.engine.variant == value)
            variants.addAction(action)
            action.triggered.connect(lambda _=False, v=value: self._set_engine(variant=v))
        menu.addSeparator()
        menu.addAction("Model settings…").triggered.connect(lambda: self._show_settings("model"))
        return menu

    def _choose_model(self, spec: str) -> None:
        s = self.controller.settings
        errors = self.controller.apply_settings(s.replace(engine=s.engine.with_model(spec)))
        for error in errors:
            self.controller.notified.emit("error", f"Cannot switch the model: {error}")

    def _set_engine(self, **changes: str) -> None:
        s = self.controller.settings
        errors = self.controller.apply_settings(s.replace(engine=s.engine.replace(**changes)))
        for error in errors:
            self.controller.notified.emit("error", f"Cannot switch the model: {error}")


class StatusWindow(QWidget):
    """Stands in for the tray icon where no system tray exists: icon, status, menu button.

    It does not accept the keyboard focus and is shown without activation (X11: WM_HINTS input
    False, _NET_WM_USER_TIME 0); the mouse still works its Menu button."""

    def __init__(self, menu: QMenu) -> None:
        super().__init__(None, Qt.WindowType.Window | Qt.WindowType.WindowDoesNotAcceptFocus)
        self.setAttribute(Qt.WidgetAttribute.WA_ShowWithoutActivating)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.setWindowTitle(APP_TITLE)
        self.icon_label = QLabel()
        self.status_label = QLabel()
        self.message_label = QLabel()
        self.message_label.setWordWrap(True)
        self.message_label.hide()  # until there is a message
        menu_button = QPushButton("Menu")
        menu_button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        menu_button.setMenu(menu)
        top = QHBoxLayout()
        top.addWidget(self.icon_label)
        top.addWidget(self.status_label, 1)
        top.addWidget(menu_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.message_label)
        self.setFixedWidth(STATUS_WIDTH)
        self.fit()

    def show_message(self, message: str) -> None:
        self.message_label.setText(message)
        self.message_label.setVisible(bool(message))
        self.fit()

    def fit(self) -> None:
        """As tall as the wrapped message needs at the fixed width (a minimum height, so a tiling
        compositor sees a window that wants to float; the user may make it taller)."""
        layout = self.layout()
        layout.activate()
        height = max(layout.totalHeightForWidth(STATUS_WIDTH), layout.totalMinimumSize().height())
        self.setMinimumHeight(height)
        if self.height() < height or not self.isVisible():
            self.resize(STATUS_WIDTH, height)


class Tray(QObject):
    """Shows the controller's state in the system tray, or in a `StatusWindow` without one."""

    def __init__(
        self,
        controller: AppController,
        show_settings: Callable[[str], None],
        show_history: Callable[[], None],
        parent: QObject | None = None,
        *,
        force_window: bool = False,
    ) -> None:
        super().__init__(parent)
        self.controller = controller
        self.menu = TrayMenu(controller, show_settings, show_history)
        self.tray: QSystemTrayIcon | None = None
        self.window: StatusWindow | None = None
        if not force_window and QSystemTrayIcon.isSystemTrayAvailable():
            self.tray = QSystemTrayIcon(status_icon(controller.status, paused=controller.hotkeys_paused), self)
            self.tray.setContextMenu(self.menu)
            self.tray.activated.connect(self._activated)
            self.tray.show()
            log.info("tray icon shown")
        else:
            log.warning(
                "no system tray on this desktop (on GNOME install the AppIndicator extension); "
                "showing a small status window instead"
            )
            self.window = StatusWindow(self.menu)
            self.window.setWindowIcon(icon("app"))
            self.refresh()  # its title is final before it appears (Sway's rule below matches it)
            keep_unfocused_on_map(status_title_pattern())
            self.window.show()  # never raise_() or activateWindow(): it must not take the focus
        controller.status_changed.connect(self.refresh)
        controller.model_label_changed.connect(self.refresh)
        controller.settings_changed.connect(self.refresh)
        controller.hotkeys_paused_changed.connect(self.refresh)
        controller.preview_changed.connect(self.refresh)
        controller.notified.connect(self.notify)
        self.refresh()

    def tooltip(self) -> str:
        c = self.controller
        s = c.settings
        status = status_text(c)
        if status == NO_MODEL_TEXT:
            status += " (Settings → Model)"
        model = c.model_label or (s.engine.model or "none chosen")
        mode = {"push_to_talk": "hold", "toggle": "press to start/stop", "hybrid": "hold or tap"}[s.hotkeys.mode]
        hotkey = f"{s.hotkeys.hotkey} ({mode})" + (" — paused" if c.hotkeys_paused else "")
        tip = f"Dictation: {status}\nModel: {model}\nHotkey: {hotkey}"
        preview = " ".join(c.preview_text.split())
        if preview and not overlay_in_use(s):  # otherwise the overlay shows it
            if len(preview) > TOOLTIP_PREVIEW_CHARS:
                preview = "…" + preview[-(TOOLTIP_PREVIEW_CHARS - 1) :]
            tip += f"\nHeard so far: {preview}"
        return tip

    def refresh(self, *_: object) -> None:
        status = self.controller.status
        tip = self.tooltip()
        shown = status_icon(status, paused=self.controller.hotkeys_paused)
        if self.tray is not None:
            self.tray.setIcon(shown)
            self.tray.setToolTip(tip)
        if self.window is not None:
            self.window.icon_label.setPixmap(shown.pixmap(24, 24))
            self.window.status_label.setText(status_text(self.controller))
            self.window.status_label.setToolTip(tip)
            self.window.setWindowTitle(window_title(status_text(self.controller)))

    def notify(self, level: str, message: str) -> None:
        if self.tray is not None and QSystemTrayIcon.supportsMessages():
            self.tray.showMessage("Dictation", message, _LEVEL_ICON.get(level, _LEVEL_ICON["info"]), 6000)
        if self.window is not None:
            self.window.show_message(message)

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason == QSystemTrayIcon.ActivationReason.Trigger:
            self.controller.toggle()
        elif reason == QSystemTrayIcon.ActivationReason.MiddleClick:
            self.menu.popup(QGuiApplication.primaryScreen().geometry().center())

    def hide(self) -> None:
        if self.tray is not None:
            self.tray.hide()
        if self.window is not None:
            self.window.close()
