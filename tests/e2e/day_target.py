"""The target window of the day-of-use test: a focused QPlainTextEdit that also logs every key event
it receives, so a hotkey key that reached it (a leak) is seen even when it inserts no character.

Run as `python day_target.py TEXT_FILE KEY_LOG` with DISPLAY set. Every change of the text is written
to TEXT_FILE (atomically). Every key press the window gets is appended to KEY_LOG as one line:
``<time.time()> <Qt key name, e.g. Key_Space> <modifiers as int> <autorepeat 0/1>``. Commands on stdin, one per
line, each answered with "ok <command>": `focus` raises and focuses the window. Prints "READY"
once shown.
"""

from __future__ import annotations

import os
import sys
import time

from PySide6.QtCore import QEvent, QObject, QSocketNotifier, Qt
from PySide6.QtWidgets import QApplication, QPlainTextEdit

TITLE = "dictation-day-target"


class KeyLog(QObject):
    """Logs the key presses that reach the text field (the chord's keys included)."""

    def __init__(self, path: str, widget) -> None:
        super().__init__()
        self.widget = widget
        self.file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - open for the app's life

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt's name
        if event.type() == QEvent.Type.KeyPress and watched is self.widget:
            try:
                name = Qt.Key(event.key()).name
            except ValueError:  # a key Qt has no name for
                name = hex(event.key())
            mods = event.modifiers().value
            self.file.write(f"{time.time():.3f} {name} {mods} {int(event.isAutoRepeat())}\n")
        return False


def main() -> None:
    out, keys = sys.argv[1], sys.argv[2]
    app = QApplication(sys.argv[:1])
    edit = QPlainTextEdit()
    key_log = KeyLog(keys, edit)
    app.installEventFilter(key_log)
    edit.setWindowTitle(TITLE)
    edit.resize(600, 300)

    def dump() -> None:
        with open(out + ".tmp", "w", encoding="utf-8") as f:
            f.write(edit.toPlainText())
        os.replace(out + ".tmp", out)

    def on_command() -> None:
        line = sys.stdin.readline()
        if not line:
            app.quit()
            return
        command = line.strip()
        if command == "focus":
            edit.raise_()
            edit.activateWindow()
            edit.setFocus()
        print(f"ok {command}", flush=True)

    notifier = QSocketNotifier(sys.stdin.fileno(), QSocketNotifier.Type.Read)
    notifier.activated.connect(on_command)
    edit.textChanged.connect(dump)
    dump()
    edit.show()
    edit.activateWindow()
    print("READY", flush=True)
    app.exec()


if __name__ == "__main__":
    main()
