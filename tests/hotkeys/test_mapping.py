"""Mapping hotkeys to each backend's identifiers: evdev KEY_* codes, pynput keys, portal keysyms."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from evdev import ecodes

from dictation.hotkeys import parse_hotkey
from dictation.hotkeys.evdev_backend import evdev_code_names, evdev_codes
from dictation.hotkeys.keys import CHAR_TO_KEY, KEYS

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(
    ("hotkey", "codes"),
    [
        ("ctrl+alt+space", [{"KEY_LEFTCTRL", "KEY_RIGHTCTRL"}, {"KEY_LEFTALT", "KEY_RIGHTALT"}, {"KEY_SPACE"}]),
        ("F9", [{"KEY_F9"}]),
        ("super+shift+d", [{"KEY_LEFTMETA", "KEY_RIGHTMETA"}, {"KEY_LEFTSHIFT", "KEY_RIGHTSHIFT"}, {"KEY_D"}]),
        ("right_ctrl", [{"KEY_RIGHTCTRL"}]),
        ("esc", [{"KEY_ESC"}]),
        ("left_alt+print_screen", [{"KEY_LEFTALT"}, {"KEY_SYSRQ"}]),
        ("menu", [{"KEY_COMPOSE"}]),
        ("ctrl+period", [{"KEY_LEFTCTRL", "KEY_RIGHTCTRL"}, {"KEY_DOT"}]),
        ("F24", [{"KEY_F24"}]),
    ],
)
def test_evdev_codes(hotkey, codes):
    expected = tuple(frozenset(getattr(ecodes, name) for name in part) for part in codes)
    assert evdev_codes(parse_hotkey(hotkey)) == expected


def test_every_key_has_a_distinct_evdev_code_and_a_valid_keysym_name():
    names = evdev_code_names()
    assert len(names) == len(KEYS)  # no two keys share a code
    for name, info in KEYS.items():
        assert names[getattr(ecodes, info.evdev)] == name
        assert re.fullmatch(r"[A-Za-z0-9_]+", info.xkb), info  # shortcuts spec: alphanumerics and _


def test_characters_fold_onto_known_keys():
    assert set(CHAR_TO_KEY.values()) <= set(KEYS)
    assert CHAR_TO_KEY["?"] == "slash" and CHAR_TO_KEY["|"] == "backslash" and CHAR_TO_KEY["A".lower()] == "a"


def test_pynput_member_names_exist():
    """Every pynput Key member we name exists in pynput (F21-F24 only on Windows)."""
    script = "from pynput.keyboard import Key; print(list(Key.__members__))"
    env = {**os.environ, "PYNPUT_BACKEND": "dummy"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    members = set(eval(out.stdout))
    ours = {ident for info in KEYS.values() for ident in info.pynput if not ident.startswith("char:")}
    assert ours - members == {"f21", "f22", "f23", "f24"}


PYNPUT_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from dictation.hotkeys import HotkeyBackendError, parse_hotkey
from dictation.hotkeys.pynput_backend import pynput_key_name, pynput_keys
out = {{}}
for text in ["ctrl+alt+space", "F9", "super+shift+d", "right_ctrl", "esc", "ctrl+minus"]:
    parts = pynput_keys(parse_hotkey(text))
    out[text] = [sorted(str(k) for k in part) for part in parts]
    # and back: every pynput key of a part translates to a physical key of that part
    for part, alternatives in zip(parts, parse_hotkey(text).physical_parts()):
        assert all(pynput_key_name(k) in alternatives for k in part), (text, part)
try:
    pynput_keys(parse_hotkey("F21"))
except HotkeyBackendError as exc:
    out["F21"] = str(exc)
print(json.dumps(out))
"""


def test_pynput_keys_on_x11(xvfb_display):
    env = {**os.environ, "DISPLAY": xvfb_display, "PYNPUT_BACKEND": "xorg"}
    script = PYNPUT_SCRIPT.format(root=str(ROOT))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    # On X11 pynput's ctrl and ctrl_l are one member (left Control), so "ctrl" is {ctrl, ctrl_r}
    assert result["ctrl+alt+space"] == [
        ["Key.ctrl", "Key.ctrl_r"],
        ["Key.alt", "Key.alt_gr", "Key.alt_r"],
        ["Key.space"],
    ]
    assert result["F9"] == [["Key.f9"]]
    assert result["super+shift+d"][2] == ["'d'"]
    assert result["right_ctrl"] == [["Key.ctrl_r"]]
    assert result["ctrl+minus"][1] == ["'-'"]
    assert result["F21"] == "pynput has no 'F21' key on this platform"
