"""Screenshots of the settings pages and the history window, for reviewing the layout.

``save_screenshot(widget, name)`` writes ``<name>.png`` to ``$DICTATION_SCREENSHOTS`` or
``<repo>/build/screenshots/``. Run ``python -m tests.app.screenshots [OUT_DIR]`` with a display to
render every page (``tests/app/test_screenshots.py`` does it under its own Xvfb).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = ("model", "vocabulary", "recording", "output", "general", "diagnostics", "log")


def screenshot_dir() -> Path:
    folder = Path(os.environ.get("DICTATION_SCREENSHOTS") or REPO / "build" / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_screenshot(widget, name: str) -> Path:
    """Render ``widget`` (as it is laid out now) to ``<screenshot dir>/<name>.png``; the path."""
    from PySide6.QtWidgets import QApplication

    QApplication.processEvents()
    path = screenshot_dir() / f"{name}.png"
    if not widget.grab().save(str(path), "PNG"):
        raise OSError(f"cannot write {path}")
    return path


def _sample_controller(folder: Path, *, first_run: bool):
    from dictation.config.settings import Adapter, LearnedWord, Replacement, Settings
    from tests.app.fakes import FakeController

    settings = Settings()
    if not first_run:
        settings = settings.replace(
            engine=settings.engine.replace(
                model="Qwen/Qwen3-ASR-1.7B",
                variant="int8",
                adapters=(Adapter(path=str(Path.home() / "adapters" / "medical-terms"), weight=0.8),),
            ),
            transcription=settings.transcription.replace(
                context="Kubernetes, PySide6, Dr. Nguyen",
                learned_words=(
                    LearnedWord(word="kubectl", heard="cube cuddle", dictated="2026-11-30T14:03:00+00:00", entry_id=12),
                ),
            ),
            output=settings.output.replace(
                replacements=(
                    Replacement(from_="pie side", to="PySide"),
                    Replacement(from_="cube control", to="kubectl"),
                )
            ),
        )
    controller = FakeController(folder, settings)
    controller.set_model_label("" if first_run else "Qwen3-ASR-1.7B · int8 · cuda")
    controller.level = 0.42
    for i, (level, name, message) in enumerate(
        [
            (logging.INFO, "dictation.app", "dictation 0.1.0 starting"),
            (logging.INFO, "dictation.hotkeys", "hotkeys: pynput (X11 session)"),
            (logging.INFO, "dictation.asr.engine", "loaded Qwen3-ASR-1.7B · int8 · cuda in 2.1 s"),
            (logging.WARNING, "dictation.output", "xdotool paste failed once; retried"),
            (logging.INFO, "dictation.session", "dictation 3: 4.2 s of audio, 17 words in 0.31 s"),
        ]
    ):
        record = logging.LogRecord(name, level, __file__, i, message, None, None)
        controller.log.append(record)
    return controller


def _sample_history(controller, folder: Path) -> None:
    from dictation.config.history import Outcome

    audio = folder / "take-3.wav"
    audio.write_bytes(b"RIFF")
    now = datetime.now(timezone.utc)
    rows = [
        ("Please send the quarterly report to Dr. Nguyen by Friday.", "English", 4.2, Outcome.PASTED, None),
        ("Der Termin ist am Dienstag um zehn Uhr.", "German", 2.9, Outcome.TYPED, None),
        ("kubectl get pods in the staging namespace", "English", 3.1, Outcome.failed("no paste tool"), audio),
        ("A longer dictation " + "that goes on and on " * 12 + "until the end.", "English", 61.0, Outcome.PASTED, None),
    ]
    for i, (text, language, duration, outcome, audio_path) in enumerate(rows):
        controller.history.add(
            text,
            language=language,
            duration_s=duration,
            model_label="Qwen3-ASR-1.7B · int8 · cuda",
            audio_path=audio_path,
            outcome=outcome,
            created=now - timedelta(days=1 if i == 0 else 0, minutes=10 * (len(rows) - i)),
        )


def render_all(out_dir: Path | None = None) -> list[Path]:
    """Render every settings page (first-run and configured) and the history window; the PNG paths."""
    from PySide6.QtTest import QTest

    from dictation.app.history_window import HistoryWindow
    from dictation.app.settings_window import SettingsWindow

    if out_dir is not None:
        os.environ["DICTATION_SCREENSHOTS"] = str(out_dir)
    paths = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        os.environ.setdefault("DICTATION_HOME", str(tmp_path / "home"))
        os.environ.setdefault("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        first = _sample_controller(tmp_path / "first", first_run=True)
        window = SettingsWindow(first)
        window.resize(960, 900)
        window.show()
        paths.append(save_screenshot(window, "settings-model-first-run"))
        window.close()

        controller = _sample_controller(tmp_path / "configured", first_run=False)
        window = SettingsWindow(controller)
        window.resize(960, 900)
        window.show()
        for page in PAGES:
            window.show_page(page)
            if page == "recording":
                QTest.qWait(150)  # a few level-meter polls
            if page == "diagnostics":
                _wait_for_diagnostics(window.page(page))
            if page == "model":
                controller.model_progress.emit("Loaded Qwen3-ASR-1.7B · int8 · cuda in 2.1 s")
                controller.download_progress.emit("Qwen/Qwen3-ASR-0.6B", 700_000_000, 1_900_000_000)
            paths.append(save_screenshot(window, f"settings-{page}"))
            paths.append(save_screenshot(window.page(page), f"page-{page}"))
        window.close()

        _sample_history(controller, tmp_path)
        history = HistoryWindow(controller)
        history.resize(960, 420)
        history.show()
        history.select_entry(controller.history.recent(10)[1].id)
        paths.append(save_screenshot(history, "history"))
        history.close()
        paths += _tray_shots(controller)
        first.close()
        controller.close()
    return paths


def _wait_for_diagnostics(page, timeout_s: float = 60.0) -> None:
    """Showing the page started its checks on a worker thread: wait for the results."""
    import time

    from PySide6.QtTest import QTest

    deadline = time.monotonic() + timeout_s
    while page.running and time.monotonic() < deadline:
        QTest.qWait(50)
    if page.running:
        raise TimeoutError(f"the diagnostics did not finish within {timeout_s:g} s")


def _tray_shots(controller) -> list[Path]:
    """The tray menu with its model submenu open, and the five state icons side by side."""
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtGui import QColor, QPainter, QPixmap
    from PySide6.QtTest import QTest

    from dictation.app.icons import status_icon
    from dictation.app.tray import PAUSED_TEXT, STATUS_TEXT, TrayMenu
    from dictation.session import Status

    controller._model_label = "Qwen3-ASR-1.7B · bf16 · cuda"
    menu = TrayMenu(controller, lambda page: None, lambda: None)
    menu.popup(QPoint(40, 40))
    QTest.qWait(100)
    paths = [save_screenshot(menu, "tray-menu")]
    model_menu = next(a.menu() for a in menu.actions() if a.menu() is not None)
    model_menu.popup(QPoint(40 + menu.width(), 40))
    QTest.qWait(100)
    paths.append(save_screenshot(model_menu, "tray-menu-model"))
    model_menu.close()
    menu.close()

    paths.append(_status_window_shot(controller))

    states = [(status_icon(status), STATUS_TEXT[status]) for status in Status]
    states.append((status_icon(Status.IDLE, paused=True), PAUSED_TEXT))
    strip = QPixmap(len(states) * 190, 80)
    strip.fill(QColor("#f4f4f5"))
    painter = QPainter(strip)
    for i, (shown, text) in enumerate(states):
        for j, size in enumerate((22, 48)):
            painter.drawPixmap(i * 190 + 10 + j * 32, 6 + (48 - size) // 2, shown.pixmap(size, size))
        painter.drawText(i * 190 + 4, 58, 184, 20, Qt.AlignmentFlag.AlignLeft, text)
    painter.end()
    path = screenshot_dir() / "tray-icons.png"
    strip.save(str(path))
    paths.append(path)
    return paths


def _status_window_shot(controller) -> Path:
    """The status window (no system tray) telling that no global hotkey works, with its advice."""
    from PySide6.QtCore import Signal
    from PySide6.QtTest import QTest

    from dictation.app.hotkey_input import no_backend_message
    from dictation.app.tray import Tray
    from dictation.hotkeys.choose import COMMANDS_HINT

    class _Controller(type(controller)):
        hotkeys_paused_changed = Signal(bool)

    own = _Controller(controller.store.path.parent / "status-window")
    tray = Tray(own, lambda page: None, lambda: None, force_window=True)
    head = "Hotkeys: none of the global hotkey backends works in this Wayland session (sway)."
    own.notified.emit("warning", no_backend_message(f"{head}\n{COMMANDS_HINT}"))
    QTest.qWait(100)
    path = save_screenshot(tray.window, "tray-status-window")
    tray.hide()
    own.close()
    return path


def main(argv: list[str]) -> int:
    from PySide6.QtWidgets import QApplication

    app = QApplication(sys.argv[:1])
    app.setApplicationName("dictation")
    for path in render_all(Path(argv[0]) if argv else None):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
