"""A real target window for the output tests: a focused QPlainTextEdit in its own process.

Run as `python target_app.py OUT_FILE` with DISPLAY set. Every change of the text is written to
OUT_FILE (atomically). Commands on stdin, one per line, each answered with "ok <command>":
`clear` empties the field, `focus` raises and focuses the window. Prints "READY" once shown.
"""

from __future__ import annotations

import os
import sys

from PySide6.QtCore import QSocketNotifier
from PySide6.QtWidgets import QApplication, QPlainTextEdit

TITLE = "dictation-output-target"


def main() -> None:
    out = sys.argv[1]
    app = QApplication(sys.argv[:1])
    # Its Wayland app_id: Qt otherwise derives one from the executable, "python" or "python3"
    # depending on the PySide6 release.
    app.setDesktopFileName(TITLE)
    edit = QPlainTextEdit()
    edit.setWindowTitle(TITLE)
    edit.resize(600, 200)

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
        if command == "clear":
            edit.clear()
            dump()
        elif command == "focus":
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
