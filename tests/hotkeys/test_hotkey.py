"""Parsing hotkey strings: canonical forms, tolerance, and one-line errors."""

from __future__ import annotations

import pytest

from dictation.hotkeys import Hotkey, HotkeyParseError, parse_hotkey
from dictation.hotkeys.keys import ALIASES, KEYS, MODIFIER_SIDES


@pytest.mark.parametrize(
    ("text", "canonical", "key", "modifiers"),
    [
        ("ctrl+alt+space", "ctrl+alt+space", "space", {"ctrl", "alt"}),
        ("Ctrl + Alt + Space", "ctrl+alt+space", "space", {"ctrl", "alt"}),
        ("  CONTROL+option+SPACEBAR ", "ctrl+alt+space", "space", {"ctrl", "alt"}),
        ("space+alt+ctrl", "ctrl+alt+space", "space", {"ctrl", "alt"}),  # any order
        ("F9", "F9", "f9", set()),
        ("f9", "F9", "f9", set()),
        ("F24", "F24", "f24", set()),
        ("super+shift+d", "super+shift+d", "d", {"super", "shift"}),
        ("shift+win+D", "super+shift+d", "d", {"super", "shift"}),
        ("cmd+shift+d", "super+shift+d", "d", {"super", "shift"}),
        ("right_ctrl", "right_ctrl", "right_ctrl", set()),  # a lone modifier as push-to-talk key
        ("rctrl", "right_ctrl", "right_ctrl", set()),
        ("Right Ctrl", "right_ctrl", "right_ctrl", set()),
        ("ctrl_r", "right_ctrl", "right_ctrl", set()),
        ("AltGr", "right_alt", "right_alt", set()),
        ("ctrl", "ctrl", "ctrl", set()),
        ("esc", "esc", "esc", set()),
        ("Escape", "esc", "esc", set()),
        ("left_alt+Page-Up", "left_alt+page_up", "page_up", {"left_alt"}),
        ("rshift+return", "right_shift+enter", "enter", {"right_shift"}),
        ("lctrl+rctrl", "left_ctrl+right_ctrl", "right_ctrl", {"left_ctrl"}),
        ("shift+ctrl", "ctrl+shift", "shift", {"ctrl"}),  # modifier-only: stable canonical form
        ("ctrl+-", "ctrl+minus", "minus", {"ctrl"}),
        ("ctrl+/", "ctrl+slash", "slash", {"ctrl"}),
        ("alt+`", "alt+grave", "grave", {"alt"}),
        ("ctrl+shift+1", "ctrl+shift+1", "1", {"ctrl", "shift"}),
        ("pause", "pause", "pause", set()),
        ("PrtSc", "print_screen", "print_screen", set()),
    ],
)
def test_valid_hotkeys(text, canonical, key, modifiers):
    hotkey = parse_hotkey(text)
    assert (str(hotkey), hotkey.key, set(hotkey.modifiers)) == (canonical, key, modifiers)
    assert parse_hotkey(str(hotkey)) == hotkey  # the canonical form round-trips
    assert Hotkey.parse(text) == hotkey


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ctlr+space", "unknown key 'ctlr' in 'ctlr+space' — did you mean 'ctrl'?"),
        ("ctrl+alt+spcae", "unknown key 'spcae' in 'ctrl+alt+spcae' — did you mean 'space'?"),
        ("escpe", "unknown key 'escpe' in 'escpe' — did you mean 'esc'?"),
        ("f99", "unknown key 'f99' in 'f99' — did you mean 'F9'?"),
        (
            "ctrl+xyzzy",
            "unknown key 'xyzzy' in 'ctrl+xyzzy' — use names like ctrl, alt, shift, super, right_ctrl, "
            "space, esc, enter, F1-F24, a-z, 0-9",
        ),
        ("", "empty hotkey — type something like 'ctrl+alt+space' or 'F9'"),
        ("   ", "empty hotkey — type something like 'ctrl+alt+space' or 'F9'"),
        ("ctrl++space", "empty key name in 'ctrl++space' — join keys with a single '+', like 'ctrl+alt+space'"),
        ("ctrl+", "empty key name in 'ctrl+' — join keys with a single '+', like 'ctrl+alt+space'"),
        ("a+b", "'a+b' has two main keys ('a' and 'b') — a hotkey is modifiers plus one key"),
        ("ctrl+F9+F10", "'ctrl+F9+F10' has two main keys ('F9' and 'F10') — a hotkey is modifiers plus one key"),
        ("ctrl+control+a", "'ctrl' appears twice in 'ctrl+control+a'"),
        ("ctrl+rctrl+x", "'ctrl' and 'right_ctrl' overlap in 'ctrl+rctrl+x' — use one of them"),
    ],
)
def test_invalid_hotkeys(text, message):
    with pytest.raises(HotkeyParseError) as excinfo:
        parse_hotkey(text)
    assert str(excinfo.value) == message
    assert isinstance(excinfo.value, ValueError)  # settings validation can catch ValueError


def test_non_string_and_direct_construction_are_validated():
    with pytest.raises(HotkeyParseError, match="must be text"):
        parse_hotkey(None)
    with pytest.raises(HotkeyParseError, match="unknown key 'spaec'"):
        Hotkey("spaec")
    with pytest.raises(HotkeyParseError, match="'a' is not a modifier"):
        Hotkey("b", frozenset({"a"}))
    with pytest.raises(HotkeyParseError, match="overlap"):
        Hotkey("space", frozenset({"alt", "left_alt"}))
    assert Hotkey("space", {"ctrl"}) == parse_hotkey("ctrl+space")  # sets are frozen; hashable
    assert len({parse_hotkey("ctrl+space"), parse_hotkey("Control + Space")}) == 1


@pytest.mark.parametrize("name", sorted(KEYS))
def test_every_key_round_trips_alone_and_with_modifiers(name):
    assert parse_hotkey(str(Hotkey(name))) == Hotkey(name)
    if name not in {s for sides in MODIFIER_SIDES.values() for s in sides}:
        combo = Hotkey(name, frozenset({"ctrl", "right_alt"}))
        assert parse_hotkey(str(combo)) == combo


def test_every_alias_resolves_to_a_known_name():
    assert set(ALIASES.values()) <= set(KEYS) | set(MODIFIER_SIDES)
