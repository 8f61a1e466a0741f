"""Binding characters that are not on the keyboard to spare keycodes before xdotool types them.

Why: to type a character outside the keymap, xdotool binds it to a spare keycode, sends the key and
unbinds it again, per character. A client that is a little slow (a loaded machine) reads the keymap
after the unbind and drops the character: "Grüße" arrives as "Grße" (seen here at 40 and 80 ms per
key under load). Binding all of the text's non-ASCII characters first with xmodmap, typing, and
unbinding well after the last key (a timer, `grace_s`) leaves no such window: xdotool finds every
character in the keymap and never remaps. More distinct characters than spare keycodes (long
Chinese text) are typed in segments, re-binding between them after the grace period.

Without xmodmap (Debian: x11-xserver-utils) xdotool's own per-key remapping is used, at 40 ms/key.
"""

from __future__ import annotations

import logging
import threading
import time

from dictation.output.process import Host, ProcResult

log = logging.getLogger(__name__)

RESERVED_FREE = 1  # spare keycodes left for xdotool's own scratch use


def _brief(result: ProcResult) -> str:
    """Why xmodmap failed, without its stderr: that quotes the keysym, i.e. a character of the text."""
    return result.error or f"xmodmap exited with {result.returncode}"


def keysym_name(ch: str) -> str:
    return f"U{ord(ch):04X}"


class KeymapBinder:
    def __init__(self, host: Host, timeout: float = 5.0, grace_s: float = 2.0):
        self.host, self.timeout, self.grace_s = host, timeout, grace_s
        self.lock = threading.RLock()
        self._owned: dict[int, str] = {}  # keycode -> character we bound there
        self._last_use = 0.0
        self._timer: threading.Timer | None = None
        self._generation = 0  # a timer that fires after a newer bind must not unbind

    def available(self) -> bool:
        return self.host.which("xmodmap") is not None

    def _free_keycodes(self) -> list[int]:
        result = self.host.run(["xmodmap", "-pke"], timeout=self.timeout)
        if not result.ok:
            return []
        free = []
        for line in result.text().splitlines():
            head, _, syms = line.partition("=")
            parts = head.split()
            if len(parts) == 2 and parts[0] == "keycode" and parts[1].isdigit() and not syms.strip():
                free.append(int(parts[1]))
        return free

    def segments(self, text: str) -> list[tuple[str, set[str]]]:
        """Split `text` so that each piece needs at most as many bindings as there are keycodes."""
        with self.lock:
            capacity = max(0, len(self._free_keycodes()) - RESERVED_FREE) + len(self._owned)
        if capacity == 0:
            return [(text, set())]
        pieces: list[tuple[str, set[str]]] = []
        start, chars = 0, set()
        for i, ch in enumerate(text):
            if ch.isascii() or ch in chars:
                continue
            if len(chars) == capacity:
                pieces.append((text[start:i], chars))
                start, chars = i, set()
            chars.add(ch)
        pieces.append((text[start:], chars))
        return pieces

    def bind(self, chars: set[str]) -> bool:
        """Make every character of `chars` typeable; False if xmodmap failed (xdotool then remaps itself)."""
        with self.lock:
            self._cancel_timer()
            missing = sorted(chars - set(self._owned.values()))
            if not missing:
                return True
            free = self._free_keycodes()
            free = [k for k in free if k not in self._owned][: max(0, len(free) - RESERVED_FREE)]
            reusable = [k for k, ch in self._owned.items() if ch not in chars]
            slots = (free + reusable)[: len(missing)]
            if len(slots) < len(missing):
                return False
            if any(k in reusable for k in slots):
                # A reused keycode may belong to a key typed moments ago: let slow clients catch up.
                time.sleep(max(0.0, self._last_use + self.grace_s - time.monotonic()))
            lines = [f"keycode {keycode} = {keysym_name(ch)}" for keycode, ch in zip(slots, missing, strict=True)]
            result = self._xmodmap(lines)
            if not result.ok:
                log.warning("binding characters failed: %s", _brief(result))
                return False
            self._owned.update(zip(slots, missing, strict=True))
            return True

    def mark_used(self) -> None:
        """Call after typing with the bound keycodes."""
        self._last_use = time.monotonic()

    def release_later(self) -> None:
        """Unbind our keycodes after the grace period, on a timer thread."""
        with self.lock:
            self._cancel_timer()
            if self._owned:
                generation = self._generation
                self._timer = threading.Timer(self.grace_s, lambda: self._release(generation))
                self._timer.daemon = True
                self._timer.start()

    def _release(self, generation: int) -> None:
        with self.lock:
            if generation == self._generation:
                self.release_now()

    def release_now(self) -> None:
        with self.lock:
            self._cancel_timer()
            if not self._owned:
                return
            result = self._xmodmap([f"keycode {keycode} =" for keycode in sorted(self._owned)])
            if not result.ok:
                log.warning("unbinding characters failed: %s", _brief(result))
            self._owned.clear()

    def _xmodmap(self, expressions: list[str]) -> ProcResult:
        """Run xmodmap expressions from stdin ("xmodmap -"): as ``-e`` arguments they would show the
        dictated text's characters (as keysyms) to every local user in ps."""
        payload = "".join(line + "\n" for line in expressions).encode("ascii")
        return self.host.run(["xmodmap", "-"], input=payload, timeout=self.timeout)

    def _cancel_timer(self) -> None:
        self._generation += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
