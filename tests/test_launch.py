"""`dictation.launch.begin`: what the app takes in its first moment, before Qt, and
what it leaves alone: a second copy takes nothing, settings decide which microphone stays open, and
the app's Recorder gets what the microphone heard before it existed."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

from dictation import launch
from dictation.audio import devices as devices_module
from dictation.config import Settings
from dictation.config.store import SettingsStore
from dictation.ipc import claim_instance
from tests.audio.fakes import FakeClock, decode
from tests.audio.test_early_stream import fake_sounddevice, push_coded


@pytest.fixture(autouse=True)
def no_display(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)


@pytest.fixture
def sd(monkeypatch):
    module = fake_sounddevice(FakeClock())
    monkeypatch.setattr(devices_module, "import_sounddevice", lambda: module)
    return module


@pytest.fixture
def keep_log():
    """begin holds log records until the app's log exists; put the root logger back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # the package's own level as the app has it (unset): an in-process `dictation bench` earlier in
    # the run sets it to ERROR, which would drop the records this test looks for
    package = logging.getLogger("dictation")
    package_level = package.level
    package.setLevel(logging.NOTSET)
    yield
    package.setLevel(package_level)
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def save(dictation_home, **recording) -> None:
    settings = Settings()
    settings = settings.replace(recording=settings.recording.replace(**recording))  # no display: no grab
    SettingsStore(dictation_home / "config" / "settings.json").save(settings)


def test_the_default_microphone_opens_and_a_recorder_for_another_is_refused_it(dictation_home, sd, keep_log):
    save(dictation_home)
    early = launch.begin()
    try:
        assert early.instance is not None and early.hotkeys is None  # no X display: nothing to grab
        raw = sd.streams[-1]
        assert early.stream is not None and raw.started and raw.kwargs["device"] == 0
        push_coded(raw, 0, 1.0)  # heard while the app was still importing Qt
        _device, max_seconds, keep_open = launch.recorder_key(Settings().recording)
        assert early.take_recorder(None, max_seconds + 1.0, keep_open) is None  # not what it opened: closed
        assert raw.closed
    finally:
        early.close()


def test_the_recorder_made_for_the_app_holds_what_was_heard_before_it(dictation_home, sd, keep_log):
    save(dictation_home)
    early = launch.begin()
    try:
        raw = sd.streams[-1]
        clock = sd.clock
        early.stream.clock = clock
        frame = push_coded(raw, 0, 1.0)
        t_press = clock()
        frame = push_coded(raw, frame, 0.5)
        recorder = early.take_recorder(*launch.recorder_key(Settings().recording))
        recorder._clock = clock
        recorder.open()
        assert len(sd.streams) == 1
        recorder.start(t_press)
        push_coded(raw, frame, 0.5)
        take = recorder.stop(t_press + 0.5)
        assert len(take.samples) >= 0.9 * 16000
        np.testing.assert_array_equal(decode(take.samples[:6400]), np.arange(16000 - 6400, 16000) % 997)
        recorder.close()
    finally:
        early.close()


def test_a_named_microphone_is_opened_instead_of_the_default(dictation_home, sd, keep_log):
    save(dictation_home, input_device="Other Mic")
    early = launch.begin()
    try:
        opened = [s for s in sd.streams if not s.closed]
        assert [s.kwargs["device"] for s in opened] == [1]
        assert early.take_recorder("Other Mic", *launch.recorder_key(Settings().recording)[1:]) is not None
    finally:
        early.close()


def test_a_microphone_opened_at_each_press_is_not_opened_ahead(dictation_home, sd, keep_log):
    save(dictation_home, keep_mic_open=False)
    early = launch.begin()
    try:
        assert early.stream is None and all(s.closed for s in sd.streams)
    finally:
        early.close()


def test_a_second_copy_takes_neither_microphone_nor_keys(dictation_home, sd, keep_log):
    save(dictation_home)
    first = claim_instance()
    try:
        early = launch.begin()
        assert early.instance is None and early.stream is None and early.hotkeys is None
        assert sd.streams == []
        early.close()
    finally:
        first.release()


def test_what_was_logged_before_the_apps_log_reaches_it(dictation_home, sd, keep_log, caplog):
    save(dictation_home)
    early = launch.begin()
    try:
        logging.getLogger("dictation.test").info("held until the app's log exists")
        with caplog.at_level(logging.INFO):
            early.release_log()
        assert "start-up: hotkeys left to the app, microphone open" in caplog.text
        assert "held until the app's log exists" in caplog.text
    finally:
        early.close()


def test_the_first_moment_imports_neither_qt_nor_numpy_nor_torch():
    code = (
        "import sys, dictation.cli, dictation.launch, dictation.config.store, dictation.hotkeys.x11_backend, "
        "dictation.audio.early_stream; print(sorted({'PySide6', 'numpy', 'torch', 'sqlite3'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
