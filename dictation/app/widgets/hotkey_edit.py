"""Hotkey capture: click the button, press the keys, and it writes the hotkey ("ctrl+alt+space").

While capturing:

- modifiers plus one key finish the capture with that combination ("ctrl+alt+k");
- modifiers pressed and released alone make a modifier-only hotkey: one key gives its side when the
  platform reports it ("right_ctrl", a good push-to-talk key), several give "ctrl+shift";
- Esc alone cancels and keeps the old hotkey (Esc with modifiers is captured);
- with ``allow_clear`` (the cancel key), Backspace alone clears it: no key;
- clicking elsewhere (focus lost) cancels.

``capture_started`` / ``capture_ended`` let the page pause the global hotkeys meanwhile, so pressing
the current hotkey does not start a dictation.
"""

from __future__ import annotations

import sys
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QToolButton, QWidget

from dictation.app.widgets.fields import FieldEditor
from dictation.config.schema import FieldInfo
from dictation.hotkeys.errors import HotkeyParseError
from dictation.hotkeys.hotkey import parse_hotkey
from dictation.hotkeys.keys import CHAR_TO_KEY

K = Qt.Key
_NAMED_KEYS: dict[int, str] = {
    K.Key_Space: "space",
    K.Key_Escape: "esc",
    K.Key_Return: "enter",
    K.Key_Enter: "enter",
    K.Key_Tab: "tab",
    K.Key_Backtab: "tab",
    K.Key_Backspace: "backspace",
    K.Key_Insert: "insert",
    K.Key_Delete: "delete",
    K.Key_Home: "home",
    K.Key_End: "end",
    K.Key_PageUp: "page_up",
    K.Key_PageDown: "page_down",
    K.Key_Up: "up",
    K.Key_Down: "down",
    K.Key_Left: "left",
    K.Key_Right: "right",
    K.Key_Pause: "pause",
    K.Key_Print: "print_screen",
    K.Key_SysReq: "print_screen",
    K.Key_ScrollLock: "scroll_lock",
    K.Key_CapsLock: "caps_lock",
    K.Key_NumLock: "num_lock",
    K.Key_Menu: "menu",
}
_NAMED_KEYS.update({int(K.Key_F1) + i: f"f{i + 1}" for i in range(24)})

# Qt's key code for a modifier key -> generic name (the side comes from the native key, if known).
_MODIFIER_KEYS: dict[int, str] = {
    K.Key_Control: "ctrl",
    K.Key_Shift: "shift",
    K.Key_Alt: "alt",
    K.Key_AltGr: "right_alt",
    K.Key_Meta: "super",
    K.Key_Super_L: "left_super",
    K.Key_Super_R: "right_super",
}
# Native key codes that tell the side: X11 keysyms, then Windows virtual-key codes.
_SIDED_NATIVE: dict[int, str] = {
    0xFFE1: "left_shift",
    0xFFE2: "right_shift",
    0xFFE3: "left_ctrl",
    0xFFE4: "right_ctrl",
    0xFFE9: "left_alt",
    0xFFEA: "right_alt",
    0xFE03: "right_alt",  # ISO_Level3_Shift (AltGr)
    0xFFEB: "left_super",
    0xFFEC: "right_super",
    0xA0: "left_shift",
    0xA1: "right_shift",
    0xA2: "left_ctrl",
    0xA3: "right_ctrl",
    0xA4: "left_alt",
    0xA5: "right_alt",
    0x5B: "left_super",
    0x5C: "right_super",
}


def _modifier_names(modifiers: Qt.KeyboardModifier) -> list[str]:
    M = Qt.KeyboardModifier
    # On macOS Qt reports Command as Control and Control as Meta.
    ctrl, meta = (
        (M.MetaModifier, M.ControlModifier) if sys.platform == "darwin" else (M.ControlModifier, M.MetaModifier)
    )
    names = []
    for flag, name in ((meta, "super"), (ctrl, "ctrl"), (M.AltModifier, "alt"), (M.ShiftModifier, "shift")):
        if modifiers & flag:
            names.append(name)
    return names


def key_name(event: QKeyEvent) -> str | None:
    """The canonical name of the non-modifier key in ``event`` ("k", "f9", "space"), or None if unknown."""
    key = event.key()
    if key in _NAMED_KEYS:
        return _NAMED_KEYS[key]
    if 0x20 < key < 0x7F:
        # Qt key codes of printable keys are their (upper-case) ASCII characters; shifted characters
        # ("!" for shift+1) fold onto their key as in the backends.
        return CHAR_TO_KEY.get(chr(key).lower())
    return None


def modifier_key_name(event: QKeyEvent) -> str | None:
    """ "right_ctrl" / "ctrl" / ... when ``event`` is a modifier key, else None."""
    generic = _MODIFIER_KEYS.get(event.key())
    if generic is None:
        return None
    return _SIDED_NATIVE.get(event.nativeVirtualKey(), generic)


def pretty_hotkey(text: str) -> str:
    """ "ctrl+alt+space" -> "Ctrl + Alt + Space"; "" -> "None"."""
    if not text:
        return "None"
    return " + ".join(part.replace("_", " ").title() if len(part) > 1 else part.upper() for part in text.split("+"))


class HotkeyEdit(FieldEditor):
    capture_started = Signal()
    capture_ended = Signal()

    def __init__(self, info: FieldInfo, *, allow_clear: bool = False, parent: QWidget | None = None):
        super().__init__(info, parent)
        self.allow_clear = allow_clear
        self._value = ""
        self._capturing = False
        self._held: list[str] = []  # modifier keys held, in press order
        self._pressed: list[str] = []  # every modifier pressed since the capture started
        row = QWidget()
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 0, 0)
        self.button = QPushButton()
        self.button.setMinimumWidth(220)
        self.button.setToolTip(info.help)
        self.button.clicked.connect(self.start_capture)
        self.button.installEventFilter(self)
        layout.addWidget(self.button)
        self.reset_button = QToolButton()
        self.reset_button.setText("Default")
        self.reset_button.setToolTip(f"Use the default: {pretty_hotkey(info.default)}")
        self.reset_button.clicked.connect(self._reset)
        layout.addWidget(self.reset_button)
        layout.addStretch(1)
        self._add(row)
        self._show_value()

    # --- FieldEditor ------------------------------------------------------------------------------

    def value(self) -> str:
        return self._value

    def set_value(self, value: Any) -> None:
        self._value = str(value)
        if not self._capturing:
            self._show_value()

    # --- capture ----------------------------------------------------------------------------------

    @property
    def capturing(self) -> bool:
        return self._capturing

    def start_capture(self) -> None:
        if self._capturing:
            return
        self._capturing = True
        self._held.clear()
        self._pressed.clear()
        hint = "Esc keeps the old one" + (", Backspace sets none" if self.allow_clear else "")
        self.button.setText(f"Press the keys… ({hint})")
        self.button.setDown(True)
        self.button.setFocus(Qt.FocusReason.OtherFocusReason)
        self.capture_started.emit()

    def cancel_capture(self) -> None:
        self._end_capture(None)

    def _end_capture(self, new_value: str | None) -> None:
        if not self._capturing:
            return
        self._capturing = False
        self.button.setDown(False)
        self._show_value()
        self.capture_ended.emit()
        if new_value is not None and new_value != self._value:
            self.committed.emit(new_value)

    def _reset(self) -> None:
        self.cancel_capture()
        if self.info.default != self._value:
            self.committed.emit(self.info.default)

    def _show_value(self) -> None:
        self.button.setText(pretty_hotkey(self._value))

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is not self.button or not self._capturing:
            return False
        kind = event.type()
        if kind == QEvent.Type.ShortcutOverride:
            event.accept()  # the keys are ours, not the window's shortcuts
            return True
        if kind == QEvent.Type.KeyPress:
            self._on_press(event)
            return True
        if kind == QEvent.Type.KeyRelease:
            self._on_release(event)
            return True
        if kind == QEvent.Type.FocusOut:
            self.cancel_capture()
        return False

    def _on_press(self, event: QKeyEvent) -> None:
        if event.isAutoRepeat():
            return
        modifier = modifier_key_name(event)
        if modifier is not None:
            if modifier not in self._held:
                self._held.append(modifier)
            if modifier not in self._pressed:
                self._pressed.append(modifier)
            self.button.setText(pretty_hotkey("+".join(self._held)) + " + …")
            return
        mods = _modifier_names(event.modifiers())
        if event.key() == Qt.Key.Key_Escape and not mods:
            self.cancel_capture()
            return
        if self.allow_clear and event.key() == Qt.Key.Key_Backspace and not mods:
            self._end_capture("")
            return
        name = key_name(event)
        if name is None:
            self.button.setText("That key cannot be used; press another (Esc keeps the old one)")
            return
        self._finish("+".join([*mods, name]))

    def _on_release(self, event: QKeyEvent) -> None:
        if event.isAutoRepeat():
            return
        modifier = modifier_key_name(event)
        if modifier is None:
            return
        # The release may report the generic name where the press had a side (or the reverse).
        self._held = [m for m in self._held if m != modifier and not _same_modifier(m, modifier)]
        if not self._held and self._pressed:
            if len(self._pressed) == 1:
                self._finish(self._pressed[0])
            else:
                self._finish("+".join(dict.fromkeys(_generic(m) for m in self._pressed)))

    def _finish(self, text: str) -> None:
        try:
            canonical = str(parse_hotkey(text))
        except HotkeyParseError as e:
            self.button.setText(f"{e}; press other keys")
            self._held.clear()
            self._pressed.clear()
            return
        self._end_capture(canonical)


def _generic(name: str) -> str:
    for generic in ("super", "ctrl", "alt", "shift"):
        if name.endswith(generic):
            return generic
    return name


def _same_modifier(a: str, b: str) -> bool:
    return _generic(a) == _generic(b) and (a == _generic(a) or b == _generic(b))
