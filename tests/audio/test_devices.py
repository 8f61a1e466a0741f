"""Device listing, selection and the PortAudio-missing message, over a fake sounddevice module."""

from __future__ import annotations

import importlib.abc
import subprocess
import sys
import types

import pytest

from dictation.audio import devices as devices_module
from dictation.audio.devices import (
    AudioDeviceError,
    InputDevice,
    find_input_device,
    format_devices,
    import_sounddevice,
    list_input_devices,
)

DEVICES = [
    InputDevice(0, "HDA Intel PCH: ALC257 Analog (hw:0,0)", 44100, 2, False, "ALSA"),
    InputDevice(4, "USB Headset Mic", 48000, 1, False, "ALSA"),
    InputDevice(7, "default", 44100, 32, True, "ALSA"),
]


class _PortAudioError(Exception):
    pass


def fake_sounddevice(default_input: int | None = 7) -> types.ModuleType:
    raw = [
        {"name": "HDA Intel PCH: ALC257 Analog (hw:0,0)", "index": 0, "hostapi": 0, "max_input_channels": 2},
        {"name": "HDMI 0", "index": 1, "hostapi": 0, "max_input_channels": 0},  # output only
        {"name": "USB Headset Mic", "index": 4, "hostapi": 0, "max_input_channels": 1},
        {"name": "default", "index": 7, "hostapi": 0, "max_input_channels": 32},
    ]
    rates = {0: 44100.0, 1: 48000.0, 4: 48000.0, 7: 44100.0}
    for info in raw:
        info["default_samplerate"] = rates[info["index"]]
    module = types.ModuleType("sounddevice")
    module.PortAudioError = _PortAudioError

    def query_devices(device=None, kind=None):
        if kind == "input":
            if default_input is None:
                raise _PortAudioError("Error querying device -1")
            return next(d for d in raw if d["index"] == default_input)
        return raw

    module.query_devices = query_devices
    module.query_hostapis = lambda: [{"name": "ALSA"}]
    return module


def test_list_input_devices_keeps_inputs_and_marks_the_default(monkeypatch):
    monkeypatch.setitem(sys.modules, "sounddevice", fake_sounddevice())
    assert list_input_devices() == DEVICES


def test_list_without_a_default_input(monkeypatch):
    monkeypatch.setitem(sys.modules, "sounddevice", fake_sounddevice(default_input=None))
    assert not any(d.is_default for d in list_input_devices())


class _NoPortAudio(importlib.abc.MetaPathFinder):
    """Makes ``import sounddevice`` fail the way it does when libportaudio2 is missing."""

    def find_spec(self, name, path=None, target=None):
        if name == "sounddevice":
            raise OSError("PortAudio library not found")
        return None


def test_missing_portaudio_is_one_clear_line(monkeypatch):
    monkeypatch.delitem(sys.modules, "sounddevice", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_NoPortAudio(), *sys.meta_path])
    with pytest.raises(AudioDeviceError) as info:
        import_sounddevice()
    message = str(info.value)
    assert "PortAudio library not found" in message and "libportaudio2" in message and "\n" not in message
    with pytest.raises(AudioDeviceError, match="libportaudio2"):
        list_input_devices()


def test_missing_sounddevice_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "sounddevice", None)  # makes the import raise ImportError
    with pytest.raises(AudioDeviceError, match="pip install sounddevice"):
        import_sounddevice()


@pytest.mark.parametrize(
    ("spec", "index"),
    [
        (None, 7),
        ("", 7),
        (4, 4),
        ("4", 4),
        ("USB Headset Mic", 4),
        ("usb headset mic", 4),
        ("headset", 4),
        ("ALC257", 0),
        ("default", 7),
    ],
)
def test_find_input_device(spec, index):
    assert find_input_device(spec, DEVICES).index == index


def test_find_input_device_refuses_what_it_cannot_pin_down():
    with pytest.raises(AudioDeviceError, match=r"no microphone named 'Blue Yeti' \(available: \[0\] HDA"):
        find_input_device("Blue Yeti", DEVICES)
    with pytest.raises(AudioDeviceError, match="no microphone with index 3"):
        find_input_device(3, DEVICES)
    with pytest.raises(AudioDeviceError, match="ambiguous"):
        find_input_device("a", DEVICES)
    with pytest.raises(AudioDeviceError, match="no microphone found"):
        find_input_device(None, [])
    # Same name under several host APIs (Windows): the first one PortAudio lists.
    twins = [
        InputDevice(1, "Mic (USB)", 44100, 1, False, "MME"),
        InputDevice(9, "Mic (USB)", 48000, 1, False, "WASAPI"),
    ]
    assert find_input_device("mic", twins).index == 1
    # No device flagged default: the first one.
    assert find_input_device(None, twins).index == 1


def test_format_devices():
    text = format_devices(DEVICES)
    lines = text.splitlines()
    assert lines[0] == "  0  HDA Intel PCH: ALC257 Analog (hw:0,0)  (ALSA, 2 channels, 44100 Hz)"
    assert lines[1] == "  4  USB Headset Mic  (ALSA, 1 channel, 48000 Hz)"
    assert lines[2] == "* 7  default  (ALSA, 32 channels, 44100 Hz)"
    assert "default input" in lines[-1]
    assert format_devices([]) == "No microphones found."


def test_audio_modules_import_neither_torch_nor_qt_nor_sounddevice():
    """`dictation devices` and the recorder must start fast: no engine, no GUI, PortAudio on demand."""
    script = (
        "import sys\n"
        "import dictation.audio.capture, dictation.audio.devices, dictation.audio.recordings, dictation.audio.trim\n"
        "print(sorted(m for m in ('torch', 'PySide6', 'sounddevice') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
    assert devices_module.PORTAUDIO_MISSING.count("\n") == 0
