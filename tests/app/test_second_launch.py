"""A second `dictation` while one runs, with two real processes: the running app answers at once and
then opens its settings window, so the second one reports success even where building the window
takes longer than the client waits (before: "the running app did not answer within 3 s", although
the window then opened)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dictation.config.settings import Settings
from dictation.config.store import SettingsStore
from dictation.ipc import IpcError, send_command

ROOT = Path(__file__).resolve().parents[2]
SLOW_S = 4.0  # building the settings window: longer than the client's 3-s wait


@pytest.fixture
def app_env(tmp_path, short_tmp, monkeypatch):
    runtime = short_tmp  # the socket's path stays under 107 bytes (tests/conftest.py)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))  # this process asks the same socket
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WAYLAND_", "DISPLAY"))}
    env.update(
        PYTHONPATH=str(ROOT),
        QT_QPA_PLATFORM="offscreen",
        DICTATION_TEST_SETTINGS_DELAY_S=str(SLOW_S),
        DICTATION_TEST_SETTINGS_MARKER=str(tmp_path / "settings-window-built"),
    )
    # A model is chosen (a folder that is not there: it fails to load), so the settings window does not
    # open at the start; the second launch is what builds it.
    settings = Settings()
    SettingsStore().save(settings.replace(engine=settings.engine.replace(model=str(tmp_path / "no-model"))))
    return env


def _answers() -> bool:
    try:
        send_command("status", timeout=2.0)
        return True
    except IpcError:
        return False


def test_a_second_launch_gets_its_answer_before_the_settings_window_is_built(app_env, tmp_path):
    marker = Path(app_env["DICTATION_TEST_SETTINGS_MARKER"])
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(
            [sys.executable, "-m", "tests.app.slow_settings_app"], env=app_env, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 60
        while not _answers():
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the first app did not start within 60 s"
            time.sleep(0.2)
        assert not marker.exists()

        second = subprocess.run(
            [sys.executable, "-m", "dictation"], env=app_env, capture_output=True, text=True, timeout=120
        )

        assert "did not answer" not in second.stderr, second.stderr
        assert second.returncode == 0, second.stderr
        assert "dictation is already running; its settings window is shown." in second.stderr
        deadline = time.monotonic() + 60
        while not marker.exists():  # and the window is built, after the answer
            assert time.monotonic() < deadline, "the settings window was not built within 60 s"
            time.sleep(0.1)
        assert _answers()  # the running app is still there and answers
    finally:
        try:
            send_command("quit", timeout=5.0)
            first.wait(30)
        except (IpcError, subprocess.TimeoutExpired):
            first.kill()
            first.wait(10)
