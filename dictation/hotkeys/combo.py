"""`ComboTracker`: turn a stream of physical key presses/releases into (binding, pressed) events.

Shared by the key-level backends (pynput, evdev); the portal reports bindings directly.

Rules, chosen for push-to-talk:

- A binding is *pressed* when its main key goes down while all its modifiers are held (for a
  modifier-only binding such as "ctrl+shift", when the last of its keys goes down, in any order), and
  no other modifier is held, so "shift+F9" does not fire "F9". Modifiers held for a binding that is
  already pressed don't count as "other", so Esc still cancels while "ctrl+alt+space" is held.
- It is *released* as soon as any of its keys goes up (the main key or a modifier).
- Auto-repeat is suppressed here: a press of a key that is already down is dropped (and counted),
  so every binding reports exactly one press and one release per physical hold. The session state
  machine never sees repeats from these backends.
- A release of a key we never saw go down (held before we started) is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping

from dictation.hotkeys.hotkey import Hotkey
from dictation.hotkeys.keys import modifier_class

Event = tuple[str, bool]


class ComboTracker:
    """Not thread-safe: feed it from one thread (the backend's listener thread)."""

    def __init__(self, bindings: Mapping[str, Hotkey]) -> None:
        self._bindings = dict(bindings)
        self._parts = {name: hk.physical_parts() for name, hk in self._bindings.items()}
        self._held: set[str] = set()
        self._active: list[str] = []  # pressed bindings, in press order
        self.repeats_suppressed = 0

    @property
    def held(self) -> frozenset[str]:
        return frozenset(self._held)

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(self._active)

    def _satisfied(self, name: str) -> bool:
        return all(any(k in self._held for k in alternatives) for alternatives in self._parts[name])

    def _triggers(self, name: str, key: str) -> bool:
        hotkey = self._bindings[name]
        if hotkey.is_modifier_only:
            return any(key in alternatives for alternatives in self._parts[name])
        return key in self._parts[name][-1]

    def _no_other_modifiers(self, name: str) -> bool:
        wanted = {modifier_class(p) for p in self._bindings[name].parts} - {None}
        for other in self._active:
            wanted |= {modifier_class(p) for p in self._bindings[other].parts} - {None}
        held = {modifier_class(k) for k in self._held} - {None}
        return held <= wanted

    def press(self, key: str) -> list[Event]:
        if key in self._held:
            self.repeats_suppressed += 1
            return []
        self._held.add(key)
        events = []
        for name in self._bindings:
            if (
                name not in self._active
                and self._triggers(name, key)
                and self._satisfied(name)
                and self._no_other_modifiers(name)
            ):
                self._active.append(name)
                events.append((name, True))
        return events

    def release(self, key: str) -> list[Event]:
        if key not in self._held:
            return []
        self._held.discard(key)
        events = []
        for name in list(self._active):
            if not self._satisfied(name):
                self._active.remove(name)
                events.append((name, False))
        return events

    def release_all(self) -> list[Event]:
        """Forget every held key (device lost, events dropped), releasing active bindings."""
        events = []
        for key in sorted(self._held):
            events += self.release(key)
        return events
