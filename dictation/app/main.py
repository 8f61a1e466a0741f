"""`dictation` with no arguments: the tray app.

Before Qt is imported, `dictation.launch.begin` (run by the CLI) takes the instance lock, grabs the
hotkey (X11) and opens the microphone, so a press in the first second after the start is recorded
from its own time and its keys never reach the focused window; `start` takes both over (given as
``early``; without it, as in tests, it claims and opens them itself at the same point below).

Start-up order: QApplication -> logging (file + log view) -> single instance (the instance lock; a
second `dictation` asks the first to show its settings and exits) -> the app's folders made private
(0700/0600) -> settings and history -> the controller's input: the microphone opened and the hotkeys
listening -> tray, overlay -> waiting (at most `INPUT_WAIT_S`) until the microphone has heard a
pre-roll's worth and the hotkeys are taken -> the command socket -> the rest of the controller
(output, sounds, the model loading in the background) -> event loop. So by the time `dictation
start` can reach the app (its socket exists), the microphone records: a press from then on is
recorded from its own time, pre-roll included (its stamp, and the pre-roll ring), although it is
handled only once the event loop runs. On the first run, with no model chosen, the
settings window opens on the Model page. A log file or history file that cannot be used does not
stop the app: it runs without it (the history then lives in memory) and says so in one line,
logged and notified.

Before all of it, when no QApplication exists yet, `run` asks `dictation.preflight` whether Qt's
platform plugin can start here: a missing system library or display becomes one message on
stderr, in the log and as a desktop notification, and exit status 1, where Qt would abort. While
"Start at login" is on, its entry is refreshed at every start (`refresh_autostart`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sqlite3
import sys
import time
from typing import TYPE_CHECKING

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from dictation import __version__
from dictation.app import qt_refs

if TYPE_CHECKING:
    from dictation.config.history import History
    from dictation.launch import Early

log = logging.getLogger(__name__)

INPUT_WAIT_S = 3.0  # at most this long for the microphone and the hotkeys before the socket is claimed
FORWARD_WAIT_S = 15.0  # a second `dictation` waits this long for a starting first one to answer


class App:
    """Everything the running app holds, created in `run`; windows are created on first use."""

    def __init__(self, qapp: QApplication, controller, tray_force_window: bool = False) -> None:
        from dictation.app.overlay import Overlay
        from dictation.app.tray import Tray

        self.qapp = qapp
        self.controller = controller
        self.settings_window = None
        self.history_window = None
        self.shutdown = lambda: None  # set by `start`: what quitting runs
        self.instance = None  # the instance lock (dictation.ipc.claim_instance), held while the app runs
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


def open_history(max_entries: int) -> tuple[History, str]:
    """The history file, or, where it cannot be opened (a folder in its place, a table that is not
    ours, a read-only folder, a full disk), a history in memory for this session and one line
    saying so: dictating never depends on the history file."""
    from dictation.config.history import IN_MEMORY, History, HistoryError

    try:
        return History(max_entries=max_entries), ""
    except (HistoryError, OSError, sqlite3.Error) as exc:
        problem = (
            f"History unavailable: {_one_line(exc)}. Dictation works; this session's dictations are kept "
            "until you quit, not saved"
        )
        return History(IN_MEMORY, max_entries=max_entries), problem


def refresh_autostart() -> list[str]:
    """While "Start at login" is on, its entry is written for this installation at every start (made
    if missing, rewritten if it differs: it never keeps starting a removed virtual environment); a
    problem doing so is one line for the user."""
    from dictation import autostart

    try:
        path = autostart.refresh()
    except autostart.AutostartError as exc:
        return [f"Start at login: {exc}"]
    if path is not None:
        log.info("start at login: wrote %s for this installation", path)
    return []


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _fail(exc: Exception) -> int:
    log.error("%s", exc)
    print(f"dictation: error: {exc}", file=sys.stderr)
    return 1


def _forward_to_running() -> int:
    """Ask the running app to show its settings; one still starting is waited for (its socket
    appears once its microphone and hotkeys are ready)."""
    from dictation.ipc import IpcError, NotRunning, send_command

    deadline = time.monotonic() + FORWARD_WAIT_S
    while True:
        try:
            send_command("show-settings")
            break
        except NotRunning:
            if time.monotonic() > deadline:
                print(
                    f"dictation: error: another dictation is starting but did not answer within {FORWARD_WAIT_S:g} s",
                    file=sys.stderr,
                )
                return 1
            time.sleep(0.1)
        except IpcError as exc:
            print(f"dictation: error: {exc}", file=sys.stderr)
            return 1
    print("dictation is already running; its settings window is shown.", file=sys.stderr)
    return 0


def _handed_over(early: Early | None) -> dict:
    """The controller's audio worker and hotkey chooser, using what ``early`` took where the
    settings still ask for the same (the open microphone, the started hotkeys), once."""
    if early is None:
        return {}
    from dictation.app.hotkey_input import APP_ID
    from dictation.app.workers import AudioWorker, RecorderConfig, _real_recorder

    def recorder_factory(config: RecorderConfig):
        taken = early.take_recorder(config.device, config.max_seconds, config.keep_open)
        return taken if taken is not None else _real_recorder(config)

    def hotkey_chooser(preference: str):
        from dictation.hotkeys import choose_backend
        from dictation.hotkeys.choose import default_factories
        from dictation.hotkeys.portal import PortalBackend

        started = early.take_hotkeys(preference)
        factories = {**default_factories(), "portal": lambda: PortalBackend(app_id=APP_ID)}
        if started is not None:
            factories["x11"] = lambda: started
        choice = choose_backend(preference, factories=factories)
        if started is not None and choice.backend is not started:
            started.stop()
        return choice

    return {"audio_worker": AudioWorker(recorder_factory=recorder_factory), "hotkey_chooser": hotkey_chooser}


def run(verbose: bool = False, early: Early | None = None) -> int:
    if QApplication.instance() is None:
        # Qt aborts (no log, nothing on screen) when no platform plugin can start: say why instead.
        from PySide6.QtCore import QLibraryInfo

        from dictation import preflight

        problem = preflight.qt_problem(plugins_root=QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath))
        if problem:
            if early is not None:
                early.close()
            return preflight.refuse_to_start(problem)
    started = start(verbose, early)
    if isinstance(started, int):
        return started
    status = started.qapp.exec()
    if started.controller.left_running:
        leave(status)
    return status


def leave(status: int) -> None:
    """Quitting left the engine's thread in a call that cannot be interrupted (controller shutdown,
    `workers.stop_threads`): everything else is saved and closed, so the process ends now, without
    waiting for the call and without Qt destroying a running thread (which aborts the process)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


def start(verbose: bool = False, early: Early | None = None) -> App | int:
    """Everything `run` does before the event loop: the running App, or the exit status when this
    instance is not the one to run (another is running, or the socket cannot be had). ``early``:
    what `dictation.launch.begin` took before Qt was imported (the instance lock, the hotkey, the
    microphone), handed over here."""
    from dictation.app.controller import AppController, Services
    from dictation.app.ipc import IpcServer
    from dictation.app.logs import record_crashes, setup_logging
    from dictation.config.store import SettingsStore
    from dictation.ipc import IpcError, claim_instance
    from dictation.paths import private_folders
    from dictation.private import repair

    qapp = QApplication.instance() or QApplication(sys.argv[:1])
    qapp.setApplicationName("dictation")
    qapp.setApplicationDisplayName("Dictation")
    qapp.setApplicationVersion(__version__)
    qapp.setDesktopFileName("dictation")
    qapp.setQuitOnLastWindowClosed(False)
    bridge, log_path = setup_logging(verbose)
    if early is not None:
        early.release_log()
    qt_refs.guard()  # before the app's Qt calls and threads: a PySide6 that loses references to None aborts 3.11

    try:
        if early is not None and early.instance_error is not None:
            raise early.instance_error
        instance = early.instance if early is not None else claim_instance()
        if early is not None:
            early.instance = None  # the app holds it from here on
    except IpcError as exc:
        return _fail(exc)
    if instance is None:  # another one runs, or is starting: it shows its settings
        return _forward_to_running()

    log.info("dictation %s starting; log file %s", __version__, log_path if not bridge.file_problem else "none")
    if not bridge.file_problem:
        record_crashes(log_path.parent)
    problems = [bridge.file_problem] if bridge.file_problem else []
    made_private = repair(private_folders())  # an older version wrote them 0644 in 0755 folders
    if made_private:
        log.warning(
            "made %d files and folders readable by you alone (other users could read them), e.g. %s",
            len(made_private),
            made_private[0],
        )
    store = early.store if early is not None and early.store is not None else SettingsStore()
    report = early.report if early is not None and early.report is not None else store.load_report()
    settings = report.settings
    history, history_problem = open_history(settings.general.history_size)
    problems += [history_problem] if history_problem else []
    if settings.general.start_at_login:
        problems += refresh_autostart()
    controller = AppController(Services(store=store, history=history, **_handed_over(early)), settings=settings)
    controller.attach_log(bridge)
    t_input = time.monotonic()
    controller.start_input()  # before anything slow: a press at launch is not lost
    app = App(qapp, controller)  # the windows, while the microphone opens
    app.instance = instance
    if not controller.wait_input_ready(INPUT_WAIT_S):
        log.warning("the microphone or the hotkeys were not ready %.0f s after the start", INPUT_WAIT_S)
    log.info("microphone and hotkeys ready %.2f s after they were started", time.monotonic() - t_input)

    server = IpcServer(controller.handle_ipc)
    try:
        first = server.listen()
    except IpcError as exc:
        first = exc
    if first is not True:  # no socket, or an app without the instance lock (an older version) answers there
        if early is not None:
            early.close()
        controller.shutdown()
        app.overlay.close()
        app.tray.hide()
        history.close()
        instance.release()
        return _fail(first) if isinstance(first, IpcError) else _forward_to_running()
    for problem in report.problems:
        controller.notified.emit("warning", f"Settings: {problem}")
    for problem in problems:  # one line each, in the log and as a notification
        log.warning("%s", problem)
        controller.notified.emit("warning", problem)

    # Ctrl+C / SIGTERM end the app cleanly (the clipboard is restored, threads joined).
    signal.signal(signal.SIGINT, lambda *_: qapp.quit())
    signal.signal(signal.SIGTERM, lambda *_: qapp.quit())
    app.wake = wake = QTimer()  # held by the app: it must live as long as the event loop
    wake.start(200)  # lets the Python interpreter run signal handlers while Qt's loop waits
    wake.timeout.connect(lambda: None)

    def shutdown() -> None:
        log.info("quitting")
        controller.shutdown()
        server.close()
        app.overlay.close()
        app.tray.hide()
        history.close()
        instance.release()

    qapp.aboutToQuit.connect(shutdown)
    app.shutdown = shutdown
    controller.start()
    if not settings.engine.model:
        app.show_settings("model")
    log.info("ready")
    return app
