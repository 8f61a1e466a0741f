"""The real start-up code refreshes the "Start at login" entry while the setting is on:
an entry left by a removed virtual environment starts this installation again, a deleted
one is made again, and one that cannot be written is one line, logged and notified, while the app
runs on. Offscreen, in a private app home and XDG config folder."""

from __future__ import annotations

import signal
import sys

import pytest

from dictation import autostart
from dictation.app import main as app_main
from dictation.app.tray import Tray
from dictation.config.settings import Settings
from dictation.config.store import SettingsStore
from tests.app.started import stop_started_apps


@pytest.fixture
def config(tmp_path, short_tmp, monkeypatch):
    runtime = short_tmp  # the socket's path stays under 107 bytes (tests/conftest.py)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


@pytest.fixture
def start(qtbot, monkeypatch):
    """Start the app as `dictation` does (with ``start_at_login`` as given); shut down afterwards."""
    notes: list[tuple[str, str]] = []
    real_notify = Tray.notify
    monkeypatch.setattr(
        Tray, "notify", lambda self, level, text: (notes.append((level, text)), real_notify(self, level, text))
    )
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = []

    def run(start_at_login: bool):
        settings = Settings()
        SettingsStore().save(settings.replace(general=settings.general.replace(start_at_login=start_at_login)))
        app = app_main.start()
        assert not isinstance(app, int), f"the app did not start (exit status {app})"
        app.notes = notes
        started.append(app)
        return app

    yield run
    stop_started_apps(started, handlers)


def stale_entry(tmp_path, monkeypatch) -> str:
    gone = str(tmp_path / "removed-venv" / "bin" / "python")
    with monkeypatch.context() as patch:
        patch.setattr(sys, "executable", gone)
        autostart.set_enabled(True, "linux")
    return gone


def test_a_stale_entry_starts_this_installation_after_a_start(qtbot, config, start, tmp_path, monkeypatch):
    gone = stale_entry(tmp_path, monkeypatch)
    assert autostart.read_entry("linux").command[0] == gone
    app = start(True)
    entry = autostart.read_entry("linux")
    assert entry.command == [sys.executable, "-m", "dictation"]
    assert not [n for n in app.notes if "Start at login" in n[1]]


def test_a_deleted_entry_is_made_again(qtbot, config, start):
    start(True)
    assert autostart.read_entry("linux").command == [sys.executable, "-m", "dictation"]


def test_no_entry_is_made_while_the_setting_is_off(qtbot, config, start):
    start(False)
    assert not (config / "autostart" / "dictation.desktop").exists()


def test_an_entry_that_cannot_be_written_is_one_line_and_the_app_runs(qtbot, config, start):
    config.write_text("a file where the config folder should be")
    app = start(True)
    lines = [r.getMessage() for r in app.controller.recent_log() if r.getMessage().startswith("Start at login: ")]
    assert lines == [f"Start at login: cannot write {config / 'autostart' / 'dictation.desktop'}: Not a directory"]
    assert ("warning", lines[0]) in app.notes
