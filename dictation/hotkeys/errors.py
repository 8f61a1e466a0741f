"""Typed hotkey errors; every message is one line a user can act on."""

from __future__ import annotations


class HotkeyError(Exception):
    """Base class for everything this package raises or reports."""


class HotkeyParseError(HotkeyError, ValueError):
    """A hotkey string that can't be understood, e.g. "unknown key 'ctlr' in 'ctlr+space' — did you mean 'ctrl'?"."""


class HotkeyBackendError(HotkeyError):
    """A backend can't start or stopped working.

    ``fatal`` is False for problems that leave the backend running (a keyboard unplugged, a shortcut
    the desktop declined to bind while others work).
    """

    def __init__(self, message: str, *, backend: str = "", fatal: bool = True) -> None:
        super().__init__(message)
        self.backend = backend
        self.fatal = fatal
