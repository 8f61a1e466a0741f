"""Whether dictated text may be sent to the window that has the keyboard focus now.

Two cases are refused before any key is sent (`OutputChain` then leaves the text on the clipboard
and the result says why, `DeliveryResult.held_back`):

- **one of our own windows has the focus** (the status window, settings, history): pasting there
  would put the dictation into the app itself. Known from two sources, either is enough: the app's
  own view (`own_window`, from Qt in the app: `QGuiApplication.focusWindow()`, which works on X11
  and on every Wayland compositor), and the desktop's (`windows.focused_window`: the focused
  window's `_NET_WM_PID` on X11, the `pid` swaymsg or hyprctl report) compared with our process id.
- **no window has the focus** (X11 focus on None, PointerRoot or the root window; an empty Sway
  workspace; no active Hyprland window): keys would go nowhere and a paste would be reported
  although nothing arrived.

Where the desktop cannot say (GNOME and KDE on Wayland tell no other program which window is
focused), only our own windows are checked, and the text is sent as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from dictation.output.environment import Session
from dictation.output.process import Host
from dictation.output.windows import WindowInfo, focused_window

OWN_WINDOW = "a Dictation window had the keyboard focus"
NO_WINDOW = "no window had the keyboard focus"


@dataclass(frozen=True)
class FocusCheck:
    """The verdict: `held_back` is None when the text may be sent, else why not (OWN_WINDOW, NO_WINDOW)."""

    held_back: str | None
    detail: str = ""  # for the log: which window, or why the desktop could not say
    window: WindowInfo | None = None


class FocusGuard:
    """Checks the keyboard focus just before text is sent.

    `own_window`: returns a short description of our window that has the focus (its title), or None
    when none of ours has it; called from the output thread, so it must only read state (the app
    passes `dictation.app.focus.OwnFocus`). `pid`: our process id (tests may name another process
    as "ours").
    """

    def __init__(
        self,
        session: Session,
        host: Host,
        *,
        own_window: Callable[[], str | None] | None = None,
        pid: int | None = None,
        timeout: float = 2.0,
    ):
        self.session, self.host, self.own_window = session, host, own_window
        self.pid = os.getpid() if pid is None else pid
        self.timeout = timeout

    def check(self) -> FocusCheck:
        ours = self.own_window() if self.own_window is not None else None
        if ours:
            return FocusCheck(OWN_WINDOW, f"our window {ours!r} has the focus (Qt)")
        window = focused_window(self.session, self.host, timeout=self.timeout)
        if window.pid is not None and window.pid == self.pid:
            return FocusCheck(OWN_WINDOW, f"window {window.id} belongs to this process ({self.pid})", window)
        if window.nothing_focused:
            return FocusCheck(NO_WINDOW, window.note, window)
        return FocusCheck(None, window.label or window.note, window)
