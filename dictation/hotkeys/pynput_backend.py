"""pynput backend: X11 (XRecord), Windows (low-level keyboard hook), macOS (Quartz event tap).

pynput reports every key press system-wide without grabbing, on its own listener thread. We translate
its `Key`/`KeyCode` objects into physical key names and let `ComboTracker` do the matching, so
held-key tracking, exact-modifier matching and auto-repeat suppression are shared with evdev.

pynput is imported lazily: on Linux its import fails without an X display, and nothing here may
touch the display before the app decides to use this backend.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from dictation.hotkeys.base import HotkeyBackend
from dictation.hotkeys.combo import ComboTracker
from dictation.hotkeys.errors import HotkeyBackendError
from dictation.hotkeys.hotkey import Hotkey
from dictation.hotkeys.keys import CHAR_TO_KEY, KEYS, display_name

log = logging.getLogger(__name__)

# pynput Key member name -> physical key name ("ctrl" is the left key on X11/macOS, see keys.py).
_KEY_MEMBERS = {ident: info.name for info in KEYS.values() for ident in info.pynput if not ident.startswith("char:")}

ListenerFactory = Callable[..., Any]
MACOS_PERMISSION = (
    "macOS does not let this app monitor the keyboard: allow it in System Settings → Privacy & Security → "
    "Input Monitoring (and Accessibility), then restart the app"
)


def _name_from_vk(vk: int) -> str | None:
    # Windows virtual-key codes and X11 keysyms agree on ASCII letters and digits.
    if 0x30 <= vk <= 0x39:
        return chr(vk)
    if 0x41 <= vk <= 0x5A or 0x61 <= vk <= 0x7A:
        return chr(vk).lower()
    return None


def pynput_key_name(key: Any, platform: str = sys.platform) -> str | None:
    """Physical key name for a pynput `Key` or `KeyCode` (None for keys we don't name, e.g. media keys).

    Characters are folded onto their key (``'D'`` and ``'d'`` -> ``'d'``, ``'!'`` -> ``'1'`` on a US
    layout), because a key pressed with Shift may be released without it.
    """
    if key is None:
        return None
    if isinstance(key, enum.Enum):
        return _KEY_MEMBERS.get(key.name)
    char = getattr(key, "char", None)
    if char:
        name = CHAR_TO_KEY.get(char.lower())
        if name:
            return name
    # With Ctrl held, Windows reports control characters ('\x04' for Ctrl+D); the virtual-key code
    # still names the key. macOS "vk" values are hardware key codes, not ASCII, so don't guess there.
    vk = getattr(key, "vk", None)
    if isinstance(vk, int) and platform != "darwin":
        return _name_from_vk(vk)
    return None


def pynput_keys(hotkey: Hotkey) -> tuple[frozenset[Any], ...]:
    """For each part of ``hotkey``, the pynput keys that satisfy it (on this platform's pynput)."""
    from pynput.keyboard import Key, KeyCode

    result = []
    for part, alternatives in zip(hotkey.parts, hotkey.physical_parts(), strict=True):
        keys = set()
        for physical in alternatives:
            for ident in KEYS[physical].pynput:
                if ident.startswith("char:"):
                    keys.add(KeyCode.from_char(ident[5:]))
                elif hasattr(Key, ident):
                    keys.add(getattr(Key, ident))
        if not keys:
            raise HotkeyBackendError(f"pynput has no {display_name(part)!r} key on this platform", backend="pynput")
        result.append(frozenset(keys))
    return tuple(result)


def _default_listener(**callbacks: Any) -> Any:
    from pynput import keyboard

    return keyboard.Listener(**callbacks)


class PynputBackend(HotkeyBackend):
    name = "pynput"

    def __init__(self, *, listener_factory: ListenerFactory | None = None, platform: str = sys.platform) -> None:
        super().__init__()
        self._listener_factory = listener_factory or _default_listener
        self._platform = platform
        self._tracker: ComboTracker | None = None
        self._listener: Any = None
        self._lock = threading.Lock()

    def is_available(self) -> tuple[bool, str]:
        try:
            from pynput import keyboard
        except ImportError as exc:
            if "pynput" in str(exc) and "No module named" in str(exc):
                return False, "the Python package 'pynput' is not installed (pip install pynput)"
            return False, f"pynput can't reach the keyboard: {exc}".rstrip(".")
        except Exception as exc:  # pynput probes the display server at import time
            return False, f"pynput failed to load: {type(exc).__name__}: {exc}"
        module = keyboard.Listener.__module__
        if module.endswith("_dummy"):
            return False, "pynput runs its dummy backend (PYNPUT_BACKEND=dummy), which sees no keys"
        if module.endswith("_xorg"):
            return True, f"X11 key events via XRecord on display {os.environ.get('DISPLAY', '?')}"
        if module.endswith("_win32"):
            return True, "Windows low-level keyboard hook"
        if module.endswith("_darwin"):
            return True, "macOS event tap (needs Input Monitoring/Accessibility permission)"
        return True, f"pynput backend {module.rsplit('.', 1)[-1].lstrip('_')}"

    @property
    def repeats_suppressed(self) -> int:
        return self._tracker.repeats_suppressed if self._tracker else 0

    def _start(self) -> None:
        self._tracker = ComboTracker(self.bindings)
        try:
            listener = self._listener_factory(on_press=self._on_press, on_release=self._on_release)
            listener.start()
        except Exception as exc:
            raise HotkeyBackendError(f"pynput could not start listening: {exc}", backend=self.name) from exc
        self._listener = listener
        # pynput's wait() has no timeout and never returns if the listener dies before it is ready
        # (no X connection); the daemon waiter is then simply left behind.
        threading.Thread(target=self._wait_listener, args=(listener,), name="hotkeys-pynput-ready", daemon=True).start()
        threading.Thread(
            target=self._watch_listener, args=(listener,), name="hotkeys-pynput-watch", daemon=True
        ).start()

    def _wait_listener(self, listener: Any) -> None:
        listener.wait()
        if listener is not self._listener:
            return
        if getattr(listener, "IS_TRUSTED", True) is False:  # pynput's macOS accessibility check
            self._report(MACOS_PERMISSION, fatal=False)
        self._ready.set()

    def _watch_listener(self, listener: Any) -> None:
        reason = "it ended unexpectedly (lost the display connection?)"
        try:
            listener.join()
        except Exception as exc:  # pynput re-raises the listener thread's exception in join()
            reason = f"{type(exc).__name__}: {exc}"
        if getattr(listener, "IS_TRUSTED", True) is False:
            reason = MACOS_PERMISSION
        if self.running and listener is self._listener:
            self._report(f"the pynput key listener stopped: {reason}", fatal=True)

    def _handle(self, key: Any, pressed: bool) -> None:
        try:
            name = pynput_key_name(key, self._platform)
            if name is None or self._tracker is None:
                return
            with self._lock:
                events = self._tracker.press(name) if pressed else self._tracker.release(name)
            self._emit(events)
        except Exception:  # an exception here would stop pynput's listener
            # Not the key itself: the listener sees every key typed, dictated text included.
            log.exception("pynput hotkey handling failed for a key %s", "press" if pressed else "release")

    def _on_press(self, key: Any, injected: bool = False) -> None:
        self._handle(key, True)

    def _on_release(self, key: Any, injected: bool = False) -> None:
        self._handle(key, False)

    def _stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        listener.stop()
        _wake_xorg_listener(listener)
        if threading.current_thread() is not listener:
            try:
                listener.join(timeout=1.0)
            except Exception:
                log.debug("pynput listener ended with an error", exc_info=True)
        # If it is still alive it ends at the next key event; _emit() drops whatever it reports.


def _wake_xorg_listener(listener: Any) -> None:
    """pynput's X11 stop() leaves its record loop waiting for one more key event. Disable the
    record context from a connection of our own (touching pynput's connections from this thread
    races with its shutdown); only the context id is read from pynput's internals."""
    context = getattr(listener, "_context", None)
    if context is None or not type(listener).__module__.endswith("_xorg"):
        return
    try:
        import Xlib.display

        display = Xlib.display.Display()
        try:
            display.set_error_handler(lambda *args: None)  # the context may be gone already
            display.record_disable_context(context)
            display.sync()
        finally:
            display.close()
    except Exception:
        log.debug("waking the pynput X11 listener failed", exc_info=True)
