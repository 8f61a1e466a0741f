"""Global hotkeys (Qt-free): parse hotkey strings and report presses/releases from a backend thread.

    from dictation.hotkeys import choose_backend, parse_hotkey

    choice = choose_backend("auto")            # portal / evdev / x11 / pynput, picked for this session
    log.info(choice.describe())                 # which one is active and why the others are not
    choice.backend.start({"dictate": parse_hotkey("ctrl+alt+space"), "cancel": parse_hotkey("esc")},
                         on_event=lambda name, pressed: ...,   # from the backend's thread: emit a signal
                         on_error=lambda error: ...)
    choice.backend.stop()

Backends are imported lazily (pynput needs a display at import time; evdev and jeepney are
Linux-only; the x11 backend imports python-xlib only when used), so importing this package is cheap and safe everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dictation.hotkeys.base import ErrorCallback, EventCallback, HotkeyBackend
    from dictation.hotkeys.choose import BACKEND_NAMES, PREFERENCES, BackendChoice, Environment, choose_backend
    from dictation.hotkeys.combo import ComboTracker
    from dictation.hotkeys.errors import HotkeyBackendError, HotkeyError, HotkeyParseError
    from dictation.hotkeys.evdev_backend import EvdevBackend
    from dictation.hotkeys.hotkey import Hotkey, parse_hotkey
    from dictation.hotkeys.portal import PortalBackend
    from dictation.hotkeys.pynput_backend import PynputBackend
    from dictation.hotkeys.x11_backend import X11GrabBackend

# Each name is imported from its module on first use: the app grabs its hotkey before anything
# else is imported (dictation.launch), and the backends it does not use cost nothing then.
_HOME = {
    "ErrorCallback": "base",
    "EventCallback": "base",
    "HotkeyBackend": "base",
    "BACKEND_NAMES": "choose",
    "PREFERENCES": "choose",
    "BackendChoice": "choose",
    "Environment": "choose",
    "choose_backend": "choose",
    "ComboTracker": "combo",
    "HotkeyBackendError": "errors",
    "HotkeyError": "errors",
    "HotkeyParseError": "errors",
    "EvdevBackend": "evdev_backend",
    "Hotkey": "hotkey",
    "parse_hotkey": "hotkey",
    "PortalBackend": "portal",
    "PynputBackend": "pynput_backend",
    "X11GrabBackend": "x11_backend",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from dictation.hotkeys import (  # noqa: F401 - each submodule becomes an attribute of this package
        base,
        choose,
        combo,
        errors,
        evdev_backend,
        hotkey,
        portal,
        pynput_backend,
        x11_backend,
    )

    value = getattr(globals()[home], name)
    globals()[name] = value
    return value


__all__ = [
    "BACKEND_NAMES",
    "PREFERENCES",
    "BackendChoice",
    "ComboTracker",
    "Environment",
    "EvdevBackend",
    "ErrorCallback",
    "EventCallback",
    "Hotkey",
    "HotkeyBackend",
    "HotkeyBackendError",
    "HotkeyError",
    "HotkeyParseError",
    "PortalBackend",
    "PynputBackend",
    "X11GrabBackend",
    "choose_backend",
    "parse_hotkey",
]
