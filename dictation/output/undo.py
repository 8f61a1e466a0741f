"""When "scratch that" may take back the previous dictation, and how many Backspaces that is.

`OutputChain` notes every dictation it typed into a window (`UndoLog.typed`): the focused window's id
as the desktop named it just before the text was sent (`focus.FocusGuard`: X11's focused window,
sway's container id, Hyprland's window address) and the number of characters sent (code points, not
bytes: "Grüße" is five Backspaces). "Scratch that" removes the newest record's characters only when

- the desktop names the focused window now, and it is the window the text went to;
- nothing else was sent by us since: every delivery adds its own record on top, and one that pressed
  Enter or Tab, failed half-way or went to a window the desktop does not name clears the log (what
  came before can no longer be reached by Backspace alone).

Otherwise nothing is sent and the reason is returned: the dictation's result says it
(`DeliveryResult.undo_refused`), the user is told and the history records it. GNOME and KDE on
Wayland name no window to other programs, so there "scratch that" is never performed. What we cannot
see: keys the user typed or a click that moved the caret inside the same window. Backspace then
removes the characters before the caret, as it would if the user pressed it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from dictation.output.windows import WindowInfo

MAX_RECORDS = 50  # "scratch that" said this many times in a row reaches back no further

NOTHING = "nothing typed by dictation is left to remove"
NO_WINDOW_ID = "the desktop does not say which window has the keyboard focus, so the text's place cannot be checked"
MOVED = "the keyboard focus moved to another window since that text was typed"
AFTER_KEY = "a key (Enter or Tab) was pressed since, which Backspace cannot take back"
HALF_SENT = "the last text was not typed completely, so how much of it arrived is unknown"


@dataclass(frozen=True)
class Typed:
    window: str  # the window's id as the desktop named it
    chars: int  # characters sent


class UndoLog:
    """The dictations typed, newest last (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._records: list[Typed] = []
        self._blocked: str | None = None  # why nothing before can be taken back (None: nothing was typed)
        self._lock = threading.Lock()

    def typed(self, text: str, window: WindowInfo | None) -> None:
        """``text`` was sent to ``window`` (the focused window before sending; None: unknown)."""
        with self._lock:
            if window is None or window.id is None:
                self._records.clear()
                self._blocked = NO_WINDOW_ID
            elif text:
                self._records.append(Typed(window.id, len(text)))
                del self._records[:-MAX_RECORDS]

    def clear(self, why: str) -> None:
        """Something was sent that Backspace cannot take back (`AFTER_KEY`, `HALF_SENT`)."""
        with self._lock:
            self._records.clear()
            self._blocked = why

    def check(self, window: WindowInfo | None) -> tuple[int, str | None]:
        """(characters to remove, None) when taking back the newest dictation is safe; else (0, why not)."""
        with self._lock:
            if not self._records:
                return 0, self._blocked or NOTHING
            if window is None or window.id is None:
                return 0, NO_WINDOW_ID
            if window.id != self._records[-1].window:
                return 0, MOVED
            return self._records[-1].chars, None

    def undone(self) -> None:
        """The newest dictation was removed."""
        with self._lock:
            if self._records:
                self._records.pop()
