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

from dictation.hotkeys.base import ErrorCallback, EventCallback, HotkeyBackend
from dictation.hotkeys.choose import BACKEND_NAMES, PREFERENCES, BackendChoice, Environment, choose_backend
from dictation.hotkeys.combo import ComboTracker
from dictation.hotkeys.errors import HotkeyBackendError, HotkeyError, HotkeyParseError
from dictation.hotkeys.evdev_backend import EvdevBackend
from dictation.hotkeys.hotkey import Hotkey, parse_hotkey
from dictation.hotkeys.portal import PortalBackend
from dictation.hotkeys.pynput_backend import PynputBackend
from dictation.hotkeys.x11_backend import X11GrabBackend

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
