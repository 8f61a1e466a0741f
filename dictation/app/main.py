"""`dictation` with no arguments: the tray app.

Start-up order: QApplication -> logging (file + log view) -> single instance (a second `dictation`
asks the first to show its settings and exits) -> settings and history -> controller (workers,
microphone, hotkeys, model loading in the background) -> tray, overlay -> event loop. On the
first run, with no model chosen, the settings window opens on the Model page.
"""

from __future__ import annotations

import logging
import signal
import sys

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from dictation import __version__

log = logging.getLogger(__name__)


class App:
    """Everything the running app holds, created in `run`; windows are created on first use."""

    def __init__(self, qapp: QApplication, controller, tray_force_window: bool = False) -> None:
        from dictation.app.overlay import Overlay
        from dictation.app.tray import Tray

        self.qapp = qapp
        self.controller = controller
        self.settings_window = None
        self.history_window = None
        self.tray = Tray(controller, self.show_settings, self.show_history, force_window=tray_force_window)
        self.overlay = Overlay(controller)
        controller.show_settings_requested.connect(self.show_settings)
        controller.show_history_requested.connect(self.show_history)
        controller.quit_requested.connect(qapp.quit)

    def show_settings(self, page: str = "") -> None:
        from dictation.app.settings_window import SettingsWindow

        if self.settings_window is None:
            self.settings_window = SettingsWindow(self.controller)
        if page:
            self.settings_window.show_page(page)
        self.settings_window.bring_forward()

    def show_history(self) -> None:
        from dictation.app.history_window import HistoryWindow

        if self.history_window is None:
            self.history_window = HistoryWindow(self.controller)
        self.history_window.show()
        self.history_window.raise_()
        self.history_window.activateWindow()


def run(verbose: bool = False) -> int:
    from dictation.app.controller import AppController, Services
    from dictation.app.ipc import IpcServer
    from dictation.app.logs import setup_logging
    from dictation.config import History
    from dictation.config.store import SettingsStore
    from dictation.ipc import IpcError, send_command

    qapp = QApplication.instance() or QApplication(sys.argv[:1])
    qapp.setApplicationName("dictation")
    qapp.setApplicationDisplayName("Dictation")
    qapp.setApplicationVersion(__version__)
    qapp.setDesktopFileName("dictation")
    qapp.setQuitOnLastWindowClosed(False)
    bridge, log_path = setup_logging(verbose)

    server = IpcServer(lambda command: {"ok": False, "message": "dictation is still starting; try again"})
    try:
        first = server.listen()
    except IpcError as exc:
        log.error("%s", exc)
        print(f"dictation: error: {exc}", file=sys.stderr)
        return 1
    if not first:
        try:
            send_command("show-settings")
        except IpcError as exc:
            print(f"dictation: error: {exc}", file=sys.stderr)
            return 1
        print("dictation is already running; its settings window is shown.", file=sys.stderr)
        return 0

    log.info("dictation %s starting; log file %s", __version__, log_path)
    store = SettingsStore()
    report = store.load_report()
    settings = report.settings
    history = History(max_entries=settings.general.history_size)
    controller = AppController(Services(store=store, history=history), settings=settings)
    server.handler = controller.handle_ipc
    controller.attach_log(bridge)
    app = App(qapp, controller)
    for problem in report.problems:
        controller.notified.emit("warning", f"Settings: {problem}")

    # Ctrl+C / SIGTERM end the app cleanly (the clipboard is restored, threads joined).
    signal.signal(signal.SIGINT, lambda *_: qapp.quit())
    signal.signal(signal.SIGTERM, lambda *_: qapp.quit())
    wake = QTimer()
    wake.start(200)  # lets the Python interpreter run signal handlers while Qt's loop waits
    wake.timeout.connect(lambda: None)

    def shutdown() -> None:
        log.info("quitting")
        controller.shutdown()
        server.close()
        app.overlay.close()
        app.tray.hide()
        history.close()

    qapp.aboutToQuit.connect(shutdown)
    controller.start()
    if not settings.engine.model:
        app.show_settings("model")
    log.info("ready")
    return qapp.exec()
