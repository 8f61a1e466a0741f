"""`dictation.launch.begin`: what the app takes in its first moment, before Qt, and
what it leaves alone: a second copy takes nothing, settings decide which microphone stays open, and
the app's Recorder gets what the microphone heard before it existed."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import pytest

from dictation import launch, launch_note
from dictation.config import Settings
from dictation.config.store import SettingsStore
from dictation.ipc import claim_instance
from tests.audio.fakes import FakeClock, decode, use_fake_portaudio
from tests.audio.test_early_stream import fake_sounddevice, push_coded


@pytest.fixture(autouse=True)
def no_display(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)


@pytest.fixture
def sd(monkeypatch):
    module = fake_sounddevice(FakeClock())
    use_fake_portaudio(monkeypatch, module)
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


# --- the note of what a launch needs from the settings ------------------------------------------------


def refuse_reading(monkeypatch) -> None:
    def read(self):
        raise AssertionError("the settings were read although the note was current")

    monkeypatch.setattr(SettingsStore, "load_report", read)


def test_the_next_launch_takes_the_microphone_and_keys_from_the_note_without_reading_the_settings(
    dictation_home, sd, keep_log, monkeypatch
):
    save(dictation_home, input_device="Other Mic")  # the app's own save notes what the launch needs
    note = dictation_home / "config" / launch_note.NOTE_FILE
    assert note.stat().st_mode & 0o777 == 0o600
    refuse_reading(monkeypatch)
    early = launch.begin()
    try:
        assert early.report is None  # the app reads the settings itself, after the grab
        assert [s.kwargs["device"] for s in sd.streams if not s.closed] == [1]
        assert early.take_recorder("Other Mic", *launch.recorder_key(Settings().recording)[1:]) is not None
    finally:
        early.close()


def test_settings_changed_by_hand_since_the_note_are_read_and_noted_again(dictation_home, sd, keep_log):
    save(dictation_home)
    path = dictation_home / "config" / "settings.json"
    data = json.loads(path.read_text())
    data["recording"]["keep_mic_open"] = False
    path.write_text(json.dumps(data))  # edited in a text editor: no note made
    early = launch.begin()
    try:
        assert early.report is not None and early.stream is None
    finally:
        early.close()
    assert (
        json.loads((dictation_home / "config" / launch_note.NOTE_FILE).read_text())["recording"]["keep_mic_open"]
        is False
    )


def test_a_note_is_only_made_from_the_file_as_it_was_read(dictation_home):
    save(dictation_home)
    path = dictation_home / "config" / "settings.json"
    read_from = launch_note.file_identity(path)
    save(dictation_home, keep_mic_open=False)  # written meanwhile (by the app)
    launch_note.write(path, Settings(), read_from)  # a launch noting what it had read before
    assert launch_note.read(path, launch_note.file_identity(path)).recording.keep_mic_open is False


def test_without_a_settings_file_the_defaults_are_noted_for_the_next_launch(dictation_home, sd, keep_log, monkeypatch):
    launch.begin().close()  # no settings saved yet: not even the config folder exists
    refuse_reading(monkeypatch)
    early = launch.begin()
    try:
        assert early.report is None and early.stream is not None  # the default: the default microphone open
    finally:
        early.close()


@pytest.mark.parametrize(
    "damage",
    [
        lambda note: "not json {",
        lambda note: json.dumps(note | {"version": "0.0.0-other"}),
        lambda note: json.dumps(note | {"recording": note["recording"] | {"max_seconds": "300"}}),
        lambda note: json.dumps(note | {"recording": note["recording"] | {"keep_mic_open": 1}}),
        lambda note: json.dumps({k: v for k, v in note.items() if k != "hotkeys"}),
    ],
    ids=["not-json", "other-version", "wrong-type", "number-for-bool", "part-missing"],
)
def test_a_note_that_is_damaged_or_from_another_version_is_not_used(dictation_home, sd, keep_log, damage):
    save(dictation_home, keep_mic_open=False)
    path = dictation_home / "config" / launch_note.NOTE_FILE
    path.write_text(damage(json.loads(path.read_text())))
    early = launch.begin()
    try:
        assert early.report is not None and early.stream is None  # read from settings.json again
    finally:
        early.close()


def test_with_a_current_note_the_first_moment_does_not_build_the_settings_schema(dictation_home):
    """The point of the note: the settings' two dozen dataclasses and the engine's option tables are
    not built before the grab (a third of the time to it)."""
    code = (
        "import sys, dictation.launch as L\n"
        "L._open_default_microphone = lambda early, claimed: None\n"
        "L.begin().close()\n"  # notes the settings
        "for name in [m for m in sys.modules if m.startswith('dictation.config') or m.startswith('dictation.asr')]:\n"
        "    del sys.modules[name]\n"
        "L.begin().close()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('dictation.config', 'dictation.asr'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize(("words", "verbose"), [([], False), (["-v"], True), (["--verbose"], True)])
def test_the_app_starts_without_building_the_command_parser(words, verbose, monkeypatch):
    """`dictation` and `dictation -v` start the app straight away: the parser imports the engine's
    option tables, time a press right after launch would lose (module docstring of dictation.launch)."""
    from dictation import cli

    started = []
    monkeypatch.setattr(cli, "build_parser", lambda: pytest.fail("the parser was built"))
    monkeypatch.setattr(cli, "cmd_app", lambda args: started.append(args.verbose) or 0)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        assert cli.main(words) == 0
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert started == [verbose]
