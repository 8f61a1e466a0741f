"""The passive key grabs (XGrabKey) on the root window, for the x11 backend (``x11_backend.py``) and
`dictation doctor`: one grab per key code of a chord's main key, per modifier mask of the chord, per
combination of the lock modifiers, shared by the chords that need the same one; a grab another
program holds already fails with BadAccess, and what the chord had grabbed is let go again."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from dictation.hotkeys.errors import HotkeyBackendError
from dictation.hotkeys.hotkey import Hotkey, parse_hotkey
from dictation.hotkeys.x11_keyboard import Chord, Keyboard
from dictation.hotkeys.x11_xkb import connect


def conflict_message(hotkey: Hotkey | str, name: str = "") -> str:
    what = "The cancel key" if name == "cancel" else "The hotkey"
    return (
        f"{what} {hotkey} is already taken by another program on this X display (it grabbed that key "
        "combination first), so it does nothing here: choose another key on the Recording page, or remove "
        "that shortcut from the other program (window manager, xbindkeys, ...)"
    )


class KeyGrabs:
    """The grabs made on ``display``'s root window: (key code, modifier state) -> the bindings it
    serves. A grab is made for the first binding that needs it and released with the last one."""

    def __init__(self, display: Any = None) -> None:
        self.display = display
        self._holders: dict[tuple[int, int], set[str]] = {}

    @property
    def empty(self) -> bool:
        return not self._holders

    def holders(self, keycode: int, state: int) -> set[str]:
        """The bindings the grab of ``keycode`` with the modifier ``state`` serves (empty: none)."""
        return self._holders.get((keycode, state), set())

    def grab(self, chord: Chord, keyboard: Keyboard) -> bool:
        """Grab ``chord`` for every lock combination (synchronously when it has sided modifiers, so a
        press can be handed back to the window); False when another program holds one of the grabs
        (BadAccess): what was grabbed for it is let go again."""
        from Xlib import X, error

        mode = X.GrabModeSync if chord.sync else X.GrabModeAsync
        root = self.display.screen().root
        catcher = error.CatchError(error.BadAccess)
        added = []
        for keycode in sorted(chord.keycodes):
            for mask in sorted(chord.masks):
                for lock in keyboard.lock_combinations(used=mask):
                    key = (keycode, mask | lock)
                    holders = self._holders.setdefault(key, set())
                    if not holders or chord.sync:
                        root.grab_key(keycode, mask | lock, False, X.GrabModeAsync, mode, onerror=catcher)
                    holders.add(chord.name)
                    added.append(key)
        self.display.sync()
        if catcher.get_error() is None:
            return True
        for key in added:
            self._release(key, chord.name)
        self.display.sync()
        return False

    def ungrab(self, name: str) -> None:
        """Release the grabs of the binding ``name`` that no other binding needs."""
        for key in [k for k, holders in self._holders.items() if name in holders]:
            self._release(key, name)
        self.display.flush()

    def _release(self, key: tuple[int, int], name: str) -> None:
        holders = self._holders.get(key)
        if holders is None:
            return
        holders.discard(name)
        if not holders:
            del self._holders[key]
            self.display.screen().root.ungrab_key(key[0], key[1])

    def ungrab_all(self) -> None:
        if self.display is None:
            return
        for keycode, state in list(self._holders):
            self.display.screen().root.ungrab_key(keycode, state)
        self._holders.clear()

    def forget(self) -> None:
        """The connection is gone (and its grabs with it): start from none."""
        self._holders.clear()
        self.display = None


def probe_grabs(hotkeys: Iterable[str], display_name: str | None = None) -> dict[str, str | None]:
    """Try to grab each hotkey (every lock combination) and let go at once: hotkey -> problem or None.

    For `dictation doctor`. BadAccess means another client holds the grab, which is the running app
    itself for the hotkey it uses."""
    from Xlib import X, error

    target = display_name or os.environ.get("DISPLAY")
    display = connect(target)
    results: dict[str, str | None] = {}
    try:
        keyboard = Keyboard(display)
        root = display.screen().root
        for text in hotkeys:
            hotkey = parse_hotkey(text)
            if hotkey.is_modifier_only:
                results[text] = None  # watched, never grabbed
                continue
            try:
                chord = keyboard.chord("probe", hotkey)
            except HotkeyBackendError as exc:
                results[text] = str(exc)
                continue
            catcher = error.CatchError(error.BadAccess)
            grabbed = [
                (code, mask | lock)
                for code in sorted(chord.keycodes)
                for mask in sorted(chord.masks)
                for lock in keyboard.lock_combinations(used=mask)
            ]
            for code, state in grabbed:
                root.grab_key(code, state, False, X.GrabModeAsync, X.GrabModeAsync, onerror=catcher)
            display.sync()
            for code, state in grabbed:
                root.ungrab_key(code, state)
            display.sync()
            results[text] = None if catcher.get_error() is None else conflict_message(hotkey)
    finally:
        display.close()
    return results
