"""Dictation's own windows in their own process, for the focus tests: the tray's status window (as
shown where no system tray exists) and, on request, the history window, plus a real output chain
guarded as the app guards it.

Run as `python own_app.py FOLDER` with PYTHONPATH at the repository root and QT_QPA_PLATFORM (xcb
or wayland) and DISPLAY or WAYLAND_DISPLAY set. Prints "READY <pid>" once the status window is
shown. Commands on stdin, one per line; each answer is one line starting with "ok <command>":

- `state`: "ok state active=<status window active> focus=<title of our focused window or None>"
- `status recording|transcribing|idle`, `notify <message>`: what the controller would emit
- `history`: open the history window as the tray's History… entry does (shown, raised, activated)
- `deliver [qt|desktop] <text>`: deliver, on a thread of its own, through `choose_backend(backend=xdotool-paste or
  wtype-paste)`; "qt" is guarded by `OwnFocus` alone (the desktop's answer, a process id, is
  compared with none), "desktop" only by the desktop's view of the focused window (its process
  id). Answers "ok deliver ok=… held_back=own|none|None on_clipboard=…".
- `button`: "ok button X Y", the screen position of the status window's Menu button;
  `menu`: "ok menu visible=<whether its menu is open>"
- `message`: "ok message fits=<all of it shows> <the status window's message>"
- `search`: "ok search <text of the history window's search field>" (where a paste into it lands)
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from PySide6.QtCore import QObject, QSocketNotifier, Signal
from PySide6.QtWidgets import QApplication, QPushButton

from dictation.app.focus import OwnFocus
from dictation.app.history_window import HistoryWindow
from dictation.app.tray import Tray
from dictation.output import OutputOptions, choose_backend
from dictation.output.focus import NO_WINDOW, OWN_WINDOW
from dictation.session import Status
from tests.app.fakes import FakeController


class _Controller(FakeController):
    hotkeys_paused_changed = Signal(bool)  # the tray listens to it; the window tests' fake has no use for it


class _Bridge(QObject):
    delivered = Signal(object)  # from the delivering thread to the GUI thread


class _NoPlayer:
    def stop(self) -> None:
        pass


def main() -> None:
    folder = Path(sys.argv[1])
    app = QApplication(sys.argv[:1])
    app.setApplicationDisplayName("Dictation")  # as the app does: Qt appends it to other titles
    app.setDesktopFileName("dictation")
    app.setQuitOnLastWindowClosed(False)
    controller = _Controller(folder)
    tray = Tray(controller, lambda page: None, lambda: None, force_window=True)
    own = OwnFocus()
    backend = "wtype-paste" if QApplication.platformName().startswith("wayland") else "xdotool-paste"
    chains = {
        guard: choose_backend(OutputOptions(backend=backend, restore_clipboard=False), own_window=probe)
        for guard, probe in (("qt", own), ("desktop", None))
    }
    chains["qt"].guard.pid = 0  # "qt": only Qt's answer can tell that the focused window is ours
    history: list[HistoryWindow] = []

    def answer(command: str, text: str = "") -> None:
        print(f"ok {command}" + (f" {text}" if text else ""), flush=True)

    def on_command() -> None:
        line = sys.stdin.readline()
        if not line:
            app.quit()
            return
        command, _, rest = line.rstrip("\n").partition(" ")
        if command == "state":
            answer(command, f"active={tray.window.isActiveWindow()} focus={own()}")
        elif command == "status":
            controller._status = {"recording": Status.RECORDING, "transcribing": Status.TRANSCRIBING}.get(
                rest, Status.IDLE
            )
            controller.status_changed.emit(controller._status)
            answer(command)
        elif command == "notify":
            controller.notified.emit("warning", rest)
            answer(command)
        elif command == "history":
            if not history:
                history.append(HistoryWindow(controller, player=_NoPlayer()))
            window = history[0]
            window.show()
            window.raise_()
            window.activateWindow()
            answer(command)
        elif command == "deliver":  # on a thread of its own, as the app's output worker does
            guard, _, text = rest.partition(" ")
            threading.Thread(target=lambda: bridge.delivered.emit(chains[guard].deliver(text)), daemon=True).start()
        elif command == "button":  # where the status window's Menu button is on the screen
            button = tray.window.findChild(QPushButton)
            centre = button.mapToGlobal(button.rect().center())
            answer(command, f"{centre.x()} {centre.y()}")
        elif command == "message":  # the status window's message, and whether all of it shows
            label = tray.window.message_label
            fits = label.isVisible() and label.heightForWidth(label.width()) <= label.height()
            answer(command, f"fits={fits} {label.text()}")
        elif command == "menu":
            answer(command, f"visible={tray.menu.isVisible()}")
        elif command == "search":
            answer(command, history[0].search.text() if history else "")
        else:
            answer(command, "unknown")

    def on_delivered(result) -> None:
        held_back = {OWN_WINDOW: "own", NO_WINDOW: "none", None: "None"}.get(result.held_back, "other")
        answer("deliver", f"ok={result.ok} held_back={held_back} on_clipboard={result.on_clipboard}")

    bridge = _Bridge()
    bridge.delivered.connect(on_delivered)
    notifier = QSocketNotifier(sys.stdin.fileno(), QSocketNotifier.Type.Read)
    notifier.activated.connect(on_command)
    print(f"READY {os.getpid()}", flush=True)
    app.exec()
    controller.close()


if __name__ == "__main__":
    main()
