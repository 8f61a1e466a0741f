"""The key vocabulary: canonical key names, the aliases users type, and each backend's identifiers.

A *physical* key name ("left_ctrl", "space", "f9", "a") names one key on the keyboard. A hotkey may
also use a *generic* modifier ("ctrl", "alt", "shift", "super") that matches either side. Backends
translate their native events into physical names; `ComboTracker` matches them against hotkeys.

Letters, digits and punctuation are named by their position on a US layout under evdev (kernel key
codes are positions) and by the typed character under pynput (X11/Windows/macOS report characters).
"""

from __future__ import annotations

import re
import string
from typing import NamedTuple


class KeyInfo(NamedTuple):  # a record, not a dataclass: imported before the hotkey grab (dictation.launch)
    """One physical key and how each backend names it."""

    name: str  # canonical name: "left_ctrl", "space", "f9", "a", "minus"
    evdev: str  # linux/input-event-codes.h name: "KEY_LEFTCTRL"
    xkb: str  # xkbcommon keysym name without XKB_KEY_ (shortcuts spec, portal triggers): "Control_L"
    pynput: tuple[str, ...]  # pynput Key member names ("ctrl_l", ...) or ("char:a",) for a KeyCode


# Generic modifier -> (left, right) physical keys, in canonical display order.
MODIFIER_SIDES: dict[str, tuple[str, str]] = {
    "super": ("left_super", "right_super"),
    "ctrl": ("left_ctrl", "right_ctrl"),
    "alt": ("left_alt", "right_alt"),
    "shift": ("left_shift", "right_shift"),
}
# Shortcuts-spec modifier names (XKB_MOD_NAME_*), used in portal trigger strings.
PORTAL_MODIFIERS = {"ctrl": "CTRL", "alt": "ALT", "shift": "SHIFT", "super": "LOGO"}
PORTAL_MODIFIER_ORDER = ("ctrl", "alt", "shift", "super")

_MODIFIER_KEYS = [
    # pynput reports the left key as the side-less member ("ctrl") on X11 and macOS, where the two
    # members are aliases; right Alt is "alt_gr" under layouts that make it ISO_Level3_Shift.
    KeyInfo("left_ctrl", "KEY_LEFTCTRL", "Control_L", ("ctrl_l", "ctrl")),
    KeyInfo("right_ctrl", "KEY_RIGHTCTRL", "Control_R", ("ctrl_r",)),
    KeyInfo("left_alt", "KEY_LEFTALT", "Alt_L", ("alt_l", "alt")),
    KeyInfo("right_alt", "KEY_RIGHTALT", "Alt_R", ("alt_r", "alt_gr")),
    KeyInfo("left_shift", "KEY_LEFTSHIFT", "Shift_L", ("shift_l", "shift")),
    KeyInfo("right_shift", "KEY_RIGHTSHIFT", "Shift_R", ("shift_r",)),
    KeyInfo("left_super", "KEY_LEFTMETA", "Super_L", ("cmd_l", "cmd")),
    KeyInfo("right_super", "KEY_RIGHTMETA", "Super_R", ("cmd_r",)),
]
_NAMED_KEYS = [
    KeyInfo("space", "KEY_SPACE", "space", ("space",)),
    KeyInfo("esc", "KEY_ESC", "Escape", ("esc",)),
    KeyInfo("enter", "KEY_ENTER", "Return", ("enter",)),
    KeyInfo("tab", "KEY_TAB", "Tab", ("tab",)),
    KeyInfo("backspace", "KEY_BACKSPACE", "BackSpace", ("backspace",)),
    KeyInfo("insert", "KEY_INSERT", "Insert", ("insert",)),
    KeyInfo("delete", "KEY_DELETE", "Delete", ("delete",)),
    KeyInfo("home", "KEY_HOME", "Home", ("home",)),
    KeyInfo("end", "KEY_END", "End", ("end",)),
    KeyInfo("page_up", "KEY_PAGEUP", "Page_Up", ("page_up",)),
    KeyInfo("page_down", "KEY_PAGEDOWN", "Page_Down", ("page_down",)),
    KeyInfo("up", "KEY_UP", "Up", ("up",)),
    KeyInfo("down", "KEY_DOWN", "Down", ("down",)),
    KeyInfo("left", "KEY_LEFT", "Left", ("left",)),
    KeyInfo("right", "KEY_RIGHT", "Right", ("right",)),
    KeyInfo("pause", "KEY_PAUSE", "Pause", ("pause",)),
    KeyInfo("print_screen", "KEY_SYSRQ", "Print", ("print_screen",)),
    KeyInfo("scroll_lock", "KEY_SCROLLLOCK", "Scroll_Lock", ("scroll_lock",)),
    KeyInfo("caps_lock", "KEY_CAPSLOCK", "Caps_Lock", ("caps_lock",)),
    KeyInfo("num_lock", "KEY_NUMLOCK", "Num_Lock", ("num_lock",)),
    KeyInfo("menu", "KEY_COMPOSE", "Menu", ("menu",)),
]
_FUNCTION_KEYS = [KeyInfo(f"f{n}", f"KEY_F{n}", f"F{n}", (f"f{n}",)) for n in range(1, 25)]
_LETTERS = [KeyInfo(c, f"KEY_{c.upper()}", c, (f"char:{c}",)) for c in string.ascii_lowercase]
_DIGITS = [KeyInfo(c, f"KEY_{c}", c, (f"char:{c}",)) for c in string.digits]
# (name, evdev, xkb, character)
_PUNCTUATION = [
    ("minus", "KEY_MINUS", "minus", "-"),
    ("equal", "KEY_EQUAL", "equal", "="),
    ("comma", "KEY_COMMA", "comma", ","),
    ("period", "KEY_DOT", "period", "."),
    ("slash", "KEY_SLASH", "slash", "/"),
    ("semicolon", "KEY_SEMICOLON", "semicolon", ";"),
    ("apostrophe", "KEY_APOSTROPHE", "apostrophe", "'"),
    ("grave", "KEY_GRAVE", "grave", "`"),
    ("left_bracket", "KEY_LEFTBRACE", "bracketleft", "["),
    ("right_bracket", "KEY_RIGHTBRACE", "bracketright", "]"),
    ("backslash", "KEY_BACKSLASH", "backslash", "\\"),
]
_PUNCT_KEYS = [KeyInfo(n, e, x, (f"char:{c}",)) for n, e, x, c in _PUNCTUATION]

KEYS: dict[str, KeyInfo] = {
    k.name: k for k in _MODIFIER_KEYS + _NAMED_KEYS + _FUNCTION_KEYS + _LETTERS + _DIGITS + _PUNCT_KEYS
}

# Character (as pynput reports it) -> physical key name; shifted US characters fold onto their key,
# so "shift+1" pressed as "!" and released as "1" is one key.
CHAR_TO_KEY: dict[str, str] = {c: c for c in string.ascii_lowercase + string.digits}
CHAR_TO_KEY.update({c: n for n, _, _, c in _PUNCTUATION})
CHAR_TO_KEY.update(dict(zip("!@#$%^&*()", "1234567890", strict=True)))
CHAR_TO_KEY.update({"_": "minus", "+": "equal", "<": "comma", ">": "period", "?": "slash", ":": "semicolon"})
CHAR_TO_KEY.update({'"': "apostrophe", "~": "grave", "{": "left_bracket", "}": "right_bracket", "|": "backslash"})
CHAR_TO_KEY[" "] = "space"

_ALIASES: dict[str, tuple[str, ...]] = {
    "ctrl": ("control", "ctl"),
    "left_ctrl": ("lctrl", "ctrl_l", "leftctrl", "lcontrol", "left_control", "control_l"),
    "right_ctrl": ("rctrl", "ctrl_r", "rightctrl", "rcontrol", "right_control", "control_r"),
    "alt": ("option", "opt"),
    "left_alt": ("lalt", "alt_l", "leftalt", "left_option", "loption"),
    "right_alt": ("ralt", "alt_r", "rightalt", "altgr", "alt_gr", "right_option", "roption"),
    "left_shift": ("lshift", "shift_l", "leftshift"),
    "right_shift": ("rshift", "shift_r", "rightshift"),
    "super": ("win", "windows", "cmd", "command", "meta", "logo", "mod4"),
    "left_super": (
        "lsuper",
        "super_l",
        "leftsuper",
        "lwin",
        "left_win",
        "lcmd",
        "left_cmd",
        "cmd_l",
        "lmeta",
        "left_meta",
    ),
    "right_super": (
        "rsuper",
        "super_r",
        "rightsuper",
        "rwin",
        "right_win",
        "rcmd",
        "right_cmd",
        "cmd_r",
        "rmeta",
        "right_meta",
    ),
    "esc": ("escape",),
    "enter": ("return",),
    "space": ("spacebar",),
    "backspace": ("bksp",),
    "delete": ("del",),
    "insert": ("ins",),
    "page_up": ("pageup", "pgup", "prior"),
    "page_down": ("pagedown", "pgdn"),
    "print_screen": ("printscreen", "print", "prtsc", "prtscr", "sysrq"),
    "scroll_lock": ("scrolllock",),
    "caps_lock": ("capslock", "caps"),
    "num_lock": ("numlock",),
    "menu": ("apps", "application", "compose"),
    "up": ("arrow_up", "up_arrow"),
    "down": ("arrow_down", "down_arrow"),
    "left": ("arrow_left", "left_arrow"),
    "right": ("arrow_right", "right_arrow"),
    "left_bracket": ("bracketleft",),
    "right_bracket": ("bracketright",),
    "period": ("dot",),
    "grave": ("backtick",),
    "apostrophe": ("quote",),
}

# Every spelling we accept (already lower-cased and normalised) -> canonical name.
ALIASES: dict[str, str] = {name: name for name in list(KEYS) + list(MODIFIER_SIDES)}
for _canonical, _spellings in _ALIASES.items():
    ALIASES.update(dict.fromkeys(_spellings, _canonical))
ALIASES.update({c: n for n, _, _, c in _PUNCTUATION})


def normalise_token(token: str) -> str:
    """'Right Ctrl' -> 'right_ctrl', ' Page-Up ' -> 'page_up'; lone punctuation is kept as is."""
    token = token.strip().lower()
    if len(token) == 1:
        return token
    return re.sub(r"[\s\-]+", "_", token)


def modifier_class(name: str) -> str | None:
    """The generic modifier a key name belongs to ('right_ctrl' -> 'ctrl', 'ctrl' -> 'ctrl'), else None."""
    if name in MODIFIER_SIDES:
        return name
    for generic, sides in MODIFIER_SIDES.items():
        if name in sides:
            return generic
    return None


def physical_keys(name: str) -> tuple[str, ...]:
    """The physical keys a hotkey part matches: 'ctrl' -> both Ctrl keys, 'f9' -> ('f9',)."""
    return MODIFIER_SIDES.get(name, (name,))


def display_name(name: str) -> str:
    """How a key appears in canonical hotkey strings: function keys as on the keycap ('F9')."""
    return name.upper() if re.fullmatch(r"f\d{1,2}", name) else name
