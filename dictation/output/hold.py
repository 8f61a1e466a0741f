"""Text waits while a hotkey of ours is held: `KeyHold`, fed by the hotkey listener, waited on by the output.

Dictating back to back, the previous take's text is often ready while the hotkey is already held
for the next one. Keys sent then do not arrive as they should (in one
measured run, 3 of 20 pastes were lost):

| hotkey backend | xdotool / pynput (XTEST) | ydotool (uinput) | wtype                | clipboard       |
|----------------|--------------------------|------------------|----------------------|-----------------|
| x11            | swallowed                | swallowed        | swallowed (XWayland) | nothing is sent |
| evdev          | combined                 | combined         | combined             | nothing is sent |
| pynput         | combined                 | combined         | combined (XWayland)  | nothing is sent |
| portal         | combined                 | combined         | combined             | nothing is sent |

- swallowed: while the chord is held the x11 backend's grab owns the keyboard, so the X server gives
  every key, our own Shift+Insert included, to the hotkey listener and none to the window.
- combined: the listening backends take nothing away, but the chord's keys are still physically
  down: Ctrl+Alt join our chord (Ctrl+Alt+Shift+Insert pastes nothing), the held Space repeats into
  the text. xdotool, ydotool and pynput send key-ups for every modifier first (`keys.py`), which the
  server honours on X11, but not where the compositor counts keys per seat (libinput drops a
  virtual device's release of a key a physical one holds), and not for the chord's main key.

So every key-sending tool waits, whatever the backend (`hazard`): `OutputChain` calls `wait()`
before it sends anything, which returns once no chord of ours is held and `settle_s` has passed
since the last release (the chord's modifiers often go up a moment after the key the backend
reports). Deliveries are serialised on the output thread, so texts that waited go out one by one,
in order, each its own paste. Only the clipboard-only backend sends nothing and never waits.

A paste spends 0.1-0.3 s on the focus probe and the clipboard before its keys, so the backends
call back right before them (`before_keys`) and the chain waits once more there. A press can
still come between that and the keys reaching the X server (the tool starting: some ms).
`mark()` there and `interrupted(mark)` after the send tell the chain;
the x11 backend first handles every key event the server had (``catch_up``: no press is missed
in that window) and counts the keys its grab took (`X11GrabBackend.keys_taken`, read through
``taken``), so `swallowed(mark)` says whether ours were among them: a paste is then sent again
after the release (nothing arrived), typed text is left on the clipboard (part of it may have).
Not caught: Ctrl and Alt pressed in those few ms, before the chord's key (the backend sees no
chord yet, the paste arrives as Ctrl+Alt+V). Measured with the next press put on purpose 0-250 ms
after each text was ready, mostly into the paste (tests/output/measure_back_to_back.py): 0 of 80
texts lost, duplicated or garbled (31 of 40 lost without the hold; 1 of 40 lost and a stray space
before `before_keys`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

SETTLE_S = 0.3  # after the last release, for the chord's modifiers to go up
MAX_WAIT_S = 600.0  # a hold this long is a lost release: the text goes to the clipboard (HELD_TOO_LONG)

# DeliveryResult.held_back, for a text not sent because of a hotkey of ours
HELD_TOO_LONG = "a hotkey of ours stayed held for over 10 minutes (a lost release?)"
TYPING_TAKEN = "the hotkey was pressed while the text was typed and took some of its keys"
PASTE_TAKEN = "the hotkey was pressed at each paste and took its keys"

SWALLOWED = "swallowed"
COMBINED = "combined"
HOTKEY_BACKENDS = ("x11", "evdev", "pynput", "portal")
GRABBING = frozenset({"x11"})  # backends that take the whole keyboard while a chord is held
KEY_TOOLS = ("xdotool", "pynput", "ydotool", "wtype")  # every output tool that sends keys


def hazard(hotkey_backend: str | None, output_backend: str) -> str | None:
    """What a held chord of ``hotkey_backend`` does to the keys of ``output_backend`` (a name from
    `select.BACKEND_NAMES`): `SWALLOWED`, `COMBINED`, or None when it sends no keys (the clipboard).
    An unknown hotkey backend (none started, or one this table does not know) counts as combined."""
    tool = output_backend.split("-")[0]
    if tool not in KEY_TOOLS:
        return None
    return SWALLOWED if hotkey_backend in GRABBING else COMBINED


@dataclass(frozen=True)
class Mark:
    """The hold's counters when a send began."""

    presses: int
    taken: int


class KeyHold:
    """Which hotkeys of ours are held now. Thread-safe: the listener's thread calls `set`, the output
    thread `wait`. ``backend`` is the hotkey backend's name (for `hazard`); ``taken`` counts the keys a
    grabbing backend took from the windows (None: it takes none); ``catch_up`` returns once the
    backend has handled every key event sent before the call (None: nothing to wait for)."""

    def __init__(self, settle_s: float = SETTLE_S, limit_s: float = MAX_WAIT_S) -> None:
        self.settle_s, self.limit_s = settle_s, limit_s
        self.backend: str | None = None
        self.taken: Callable[[], int] | None = None
        self.catch_up: Callable[[], object] | None = None
        self._clock = time.monotonic
        self._cond = threading.Condition()
        self._waiting = 0
        self._held: set[str] = set()
        self._presses = 0
        self._released_at: float | None = None

    def set(self, name: str, pressed: bool) -> None:
        """A binding was pressed or released (the listener's thread, as the backend reports it)."""
        with self._cond:
            if pressed:
                self._presses += name not in self._held
                self._held.add(name)
            elif name in self._held:
                self._held.discard(name)
                self._released_at = self._clock()
            self._cond.notify_all()

    def reset(self) -> None:
        """The backend stopped: nothing is held any more (a waiting delivery goes ahead)."""
        with self._cond:
            self._held.clear()
            self._released_at = None
            self._cond.notify_all()

    @property
    def held(self) -> frozenset[str]:
        with self._cond:
            return frozenset(self._held)

    def hazard(self, output_backend: str) -> str | None:
        return hazard(self.backend, output_backend)

    @property
    def waiting(self) -> int:
        """How many deliveries wait now."""
        with self._cond:
            return self._waiting

    def wait(self) -> tuple[float, bool]:
        """Block until no chord is held and `settle_s` has passed since the last release. Returns the
        seconds waited, and False when the hold outlasted `limit_s` (a release was lost)."""
        start = self._clock()
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    now = self._clock()
                    left = self.limit_s - (now - start)
                    if left <= 0:
                        return now - start, False
                    if not self._held:
                        since = None if self._released_at is None else now - self._released_at
                        if since is None or since >= self.settle_s:
                            return now - start, True
                        left = min(left, self.settle_s - since)
                    self._cond.wait(left)
            finally:
                self._waiting -= 1

    def mark(self) -> Mark:
        with self._cond:
            return Mark(self._presses, self._taken())

    def interrupted(self, mark: Mark) -> bool:
        """A chord was pressed since ``mark`` (asked after the keys were sent: the backend first
        catches up with the server, so a press that came before them is counted)."""
        if self.catch_up is not None:
            self.catch_up()
        with self._cond:
            return self._presses != mark.presses

    def swallowed(self, mark: Mark) -> bool:
        """The grab took keys since ``mark``. Ask after `wait()`: the backend reports a release only
        after it has seen every key that came before it, ours included."""
        with self._cond:
            return self._taken() != mark.taken

    def _taken(self) -> int:
        return self.taken() if self.taken is not None else 0
