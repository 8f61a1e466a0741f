"""The keyboard as X maps it, for the x11 backend (``x11_backend.py``): which key codes carry a key
name, which modifier masks a chord's modifiers set (one side or both, AltGr as right Alt), and the
lock modifiers (Caps Lock, Num Lock, Scroll Lock where the layout maps it) a grab must allow for.
Read from one X connection's mapping, made again when the mapping changes."""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable
from typing import Any, NamedTuple

from dictation.hotkeys.errors import HotkeyBackendError
from dictation.hotkeys.hotkey import Hotkey
from dictation.hotkeys.keys import KEYS, MODIFIER_SIDES

# Keysyms a physical key may carry besides its own: layouts with AltGr put ISO_Level3_Shift on the
# right Alt key (pynput reports it as alt_gr, which keys.py counts as right_alt too).
EXTRA_KEYSYMS = {"right_alt": ("ISO_Level3_Shift",)}
LOCK_KEYSYMS = ("Caps_Lock", "Num_Lock", "Scroll_Lock")
MODIFIER_BITS = 0xFF  # Shift, Lock, Control, Mod1-Mod5; the higher bits of a key event's state are buttons


class Chord(NamedTuple):  # a record, not a dataclass: imported before the hotkey grab (dictation.launch)
    """One binding as X sees it: the key codes of its main key and the modifier masks that fire it."""

    name: str
    hotkey: Hotkey
    keycodes: frozenset[int]
    masks: frozenset[int]  # exact modifier states (without the locks) that fire it
    sided: tuple[frozenset[int], ...]  # per sided modifier ("right_ctrl"): its key codes, one must be down

    @property
    def sync(self) -> bool:
        """Grab synchronously, so a press with the other side's modifier can be handed back."""
        return bool(self.sided)


class Keyboard:
    """Key codes and modifier masks of the current keyboard mapping of one X connection."""

    def __init__(self, display: Any) -> None:
        from Xlib import XK

        XK.load_keysym_group("xkb")  # ISO_Level3_Shift; latin1 and miscellany are loaded already
        self._display = display
        self._xk = XK
        self._modmap = [frozenset(c for c in codes if c) for codes in display.get_modifier_mapping()]
        locks = 1 << 1  # the Lock modifier (Caps Lock), whatever key carries it
        for keysym in LOCK_KEYSYMS:
            locks |= self.mask_of(self.keycodes(keysym))
        self.lock_mask = locks

    def keycodes(self, keysym_name: str) -> frozenset[int]:
        keysym = self._xk.string_to_keysym(keysym_name)
        if not keysym:
            return frozenset()
        return frozenset(code for code, _index in self._display.keysym_to_keycodes(keysym))

    def key_codes(self, name: str) -> frozenset[int]:
        """Key codes of a physical key name ("space", "right_alt")."""
        codes = self.keycodes(KEYS[name].xkb)
        for extra in EXTRA_KEYSYMS.get(name, ()):
            codes |= self.keycodes(extra)
        return codes

    def mask_of(self, keycodes: Iterable[int]) -> int:
        codes = set(keycodes)
        return sum(1 << i for i, members in enumerate(self._modmap) if members & codes)

    def lock_combinations(self, used: int = 0) -> list[int]:
        """Every combination of the lock modifiers (those a chord does not use itself)."""
        bits = [1 << i for i in range(8) if (self.lock_mask & ~used) & (1 << i)]
        return sorted({sum(combo) for r in range(len(bits) + 1) for combo in itertools.combinations(bits, r)})

    def chord(self, name: str, hotkey: Hotkey) -> Chord:
        """Raise HotkeyBackendError when this keyboard can't produce ``hotkey``."""
        keycodes = self.key_codes(hotkey.key)
        if not keycodes:
            raise HotkeyBackendError(f"{hotkey}: no key of this keyboard layout produces {hotkey.key!r}", backend="x11")
        options: list[set[int]] = []
        sided: list[frozenset[int]] = []
        for part in sorted(hotkey.modifiers):
            physical = MODIFIER_SIDES.get(part, (part,))
            masks = {self.mask_of(self.key_codes(p)) for p in physical} - {0}
            if not masks:
                raise HotkeyBackendError(
                    f"{hotkey}: no modifier of this keyboard layout is carried by {part!r}", backend="x11"
                )
            options.append(masks)
            if part not in MODIFIER_SIDES:
                sided.append(self.key_codes(part))
        masks = frozenset(functools.reduce(operator.or_, combo, 0) for combo in itertools.product(*options))
        return Chord(name, hotkey, keycodes, masks, tuple(sided))


def is_down(keymap: list[int], keycode: int) -> bool:
    """Whether ``keycode`` is down in ``keymap`` (the bit vector XQueryKeymap answers)."""
    return bool(keymap[keycode >> 3] & (1 << (keycode & 7)))
