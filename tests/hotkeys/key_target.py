"""A real target window for the X11 grab tests: a Qt text field that reports every key event it gets.

    DISPLAY=:N python tests/hotkeys/key_target.py
    stdout: SHOWN <window id> | PRESS|RELEASE <X key code> <auto-repeat 0|1> <Qt key> | TEXT <repr of the text>

Run it on the xcb platform (never offscreen): focus and key events must come from the X server.
"""

from __future__ import annotations

import sys

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QApplication, QTextEdit


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class KeyLog(QObject):
    def eventFilter(self, watched, event):  # noqa: N802 - Qt's name
        if event.type() in (QEvent.Type.KeyPress, QEvent.Type.KeyRelease):
            kind = "PRESS" if event.type() == QEvent.Type.KeyPress else "RELEASE"
            say(f"{kind} {event.nativeScanCode()} {int(event.isAutoRepeat())} {event.key()}")
        return False


def main() -> int:
    app = QApplication(sys.argv[:1] + ["-platform", "xcb"])
    field = QTextEdit()
    field.setWindowTitle("Hotkey Target")
    log = KeyLog()
    field.installEventFilter(log)
    field.textChanged.connect(lambda: say(f"TEXT {field.toPlainText()!r}"))
    field.show()
    field.activateWindow()
    say(f"SHOWN {int(field.winId())}")
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
