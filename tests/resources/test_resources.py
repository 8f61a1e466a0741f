"""The packaged icons, sounds and .desktop template: present, well formed, and what they claim to be."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
import textwrap
import wave
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from dictation import resources
from dictation.audio.wav import read_wav
from dictation.session import Sound, Status

ROOT = Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"


def test_there_is_an_icon_for_every_tray_status_and_a_sound_for_every_cue():
    assert set(resources.ICON_STATES) == {status.value for status in Status} | {"paused"}  # hotkeys paused
    assert set(resources.SOUNDS) == {sound.value for sound in Sound}


@pytest.mark.parametrize("state", [*resources.ICON_STATES, "app"])
def test_icons_are_64px_svgs(state):
    path = resources.icon_path(state)
    assert path.is_file() and path.suffix == ".svg"
    assert resources.icon_svg(state) == path.read_bytes()
    root = ET.fromstring(path.read_bytes())
    assert root.tag == f"{SVG}svg"
    assert root.get("viewBox") == "0 0 64 64"
    assert len(list(root.iter())) > 3  # something is drawn


def test_icons_accept_status_values_and_refuse_unknown_states():
    assert resources.icon_path(Status.RECORDING) == resources.icon_path("recording")
    with pytest.raises(ValueError, match="no icon for 'sleeping'"):
        resources.icon_path("sleeping")


def test_each_state_is_told_apart_by_its_colour_at_tray_size():
    """Rendered at 22 px (Qt's SVG renderer, offscreen): the colour says the state."""
    script = textwrap.dedent("""
        import json, sys
        from PySide6.QtCore import QRectF, Qt
        from PySide6.QtGui import QColor, QGuiApplication, QImage, QPainter
        from PySide6.QtSvg import QSvgRenderer
        app = QGuiApplication([])
        result = {}
        for state, path in json.loads(sys.argv[1]).items():
            renderer = QSvgRenderer(path)
            assert renderer.isValid(), path
            image = QImage(22, 22, QImage.Format.Format_ARGB32)
            image.fill(Qt.GlobalColor.transparent)
            painter = QPainter(image)
            renderer.render(painter, QRectF(0, 0, 22, 22))
            painter.end()
            hues, opaque = [], 0
            for y in range(22):
                for x in range(22):
                    c = image.pixelColor(x, y)
                    if c.alpha() > 200:
                        opaque += 1
                        if c.hsvSaturation() > 120 and c.value() > 120:
                            hues.append(c.hsvHue())
            result[state] = {"opaque": opaque, "hues": hues}
        print(json.dumps(result))
    """)
    paths = {state: str(resources.icon_path(state)) for state in resources.ICON_STATES}
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(paths)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)

    def share(state, low, high):
        hues = found[state]["hues"]
        return sum(low <= h <= high or (low > high and (h >= low or h <= high)) for h in hues) / max(1, len(hues))

    for state in resources.ICON_STATES:
        assert found[state]["opaque"] > 60, f"{state}: too little is drawn to see at 22 px"
    assert found["idle"]["hues"] == []  # grey: no colour at all
    assert share("recording", 330, 15) > 0.9  # red
    assert share("transcribing", 195, 230) > 0.8  # blue
    assert share("loading", 15, 50) > 0.9  # amber / orange
    assert share("error", 330, 15) > 0.9 and len(found["error"]["hues"]) > 20  # a red badge on grey
    # paused: grey like idle (nothing is wrong), told apart by its dark badge
    assert found["paused"]["hues"] == [] and found["paused"]["opaque"] > found["idle"]["opaque"] + 40


@pytest.mark.parametrize("cue", resources.SOUNDS)
def test_sounds_are_short_clean_16bit_mono_wavs(cue):
    path = resources.sound_path(cue)
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 44_100)
    samples, rate = read_wav(path)
    assert 0.08 <= len(samples) / rate <= 0.25
    peak = float(np.max(np.abs(samples)))
    assert 0.2 < peak < 0.99  # audible, never clipped
    edge = round(0.0005 * rate)  # no click: silence at both ends, faded in and out over milliseconds
    assert samples[0] == 0 and samples[-1] == 0
    assert np.max(np.abs(samples[:edge])) < 0.1 * peak and np.max(np.abs(samples[-edge:])) < 0.1 * peak


def pitch(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples)), 1 << 16))
    return float(np.fft.rfftfreq(1 << 16, 1 / rate)[np.argmax(spectrum)])


def test_start_rises_stop_falls_and_the_error_is_lowest():
    start, rate = read_wav(resources.sound_path("start"))
    stop, _ = read_wav(resources.sound_path("stop"))
    error, _ = read_wav(resources.sound_path("error"))
    cancel, _ = read_wav(resources.sound_path("cancel"))
    half = len(start) // 2
    assert pitch(start[:half], rate) < pitch(start[half:], rate)
    assert pitch(stop[:half], rate) > pitch(stop[half:], rate)
    assert pitch(error, rate) < pitch(cancel, rate) < min(pitch(start, rate), pitch(stop, rate))


def test_committed_sounds_are_what_the_generator_writes(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "make_sounds.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for cue in resources.SOUNDS:
        assert (tmp_path / f"{cue}.wav").read_bytes() == resources.read_bytes(f"sounds/{cue}.wav"), cue


def test_desktop_template_is_a_valid_entry_once_filled():
    template = resources.desktop_template()
    assert "{exec}" in template and "{icon}" in template
    text = template.replace("{exec}", "dictation").replace("{icon}", "dictation")
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str
    parser.read_string(text)
    entry = parser["Desktop Entry"]
    assert (entry["Type"], entry["Name"], entry["Exec"], entry["Terminal"]) == (
        "Application",
        "Dictation",
        "dictation",
        "false",
    )
    assert entry["Categories"].endswith(";")


def test_missing_resource_is_named():
    with pytest.raises(FileNotFoundError, match="packaged resource 'icons/none.svg' is missing"):
        resources.read_bytes("icons/none.svg")
