"""The backend interface: start listening for named hotkeys, report presses and releases.

Contract, shared by every backend:

- ``start(bindings, on_event, on_error=None)`` returns quickly (it never waits for a user or a
  device); it raises `HotkeyBackendError` only for problems it can see at once.
- ``on_event(name, pressed)`` is called from the backend's own thread, once per press and once per
  release of a binding. Auto-repeat is suppressed in the backend. The callback must not block; the
  app forwards it to the GUI thread with a signal (docs/architecture.md, principle 4). Exceptions it raises are logged
  and do not stop the listener.
- ``on_error(error)`` reports problems found later (portal dialog dismissed, keyboard unplugged,
  listener died), also from the backend's thread; ``error.fatal`` says whether hotkeys stopped.
  After a fatal error the backend stays "running" until ``stop()``; call it before starting again.
- ``stop()`` is idempotent; after it returns no callback is made.
- ``set_enabled(name, enabled)`` (any thread): a disabled binding is not reported (except the
  release of a press reported before: every reported press gets its release, so who tracks what is
  held, e.g. `dictation.output.hold`, never sees Esc stay down after it cancelled), and a backend
  that takes keys away from other applications (x11) takes its key only while it is enabled. The app
  enables the cancel key only while it records, so Esc keeps working everywhere else. ``start(...,
  disabled=names)`` starts with those bindings disabled.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar

from dictation.hotkeys.errors import HotkeyBackendError
from dictation.hotkeys.hotkey import Hotkey, parse_hotkey

log = logging.getLogger(__name__)

EventCallback = Callable[[str, bool], None]
ErrorCallback = Callable[[HotkeyBackendError], None]


def normalise_bindings(bindings: Mapping[str, Hotkey | str]) -> dict[str, Hotkey]:
    """Validate a name -> hotkey mapping; strings are parsed."""
    if not bindings:
        raise HotkeyBackendError("no hotkeys to listen for")
    result = {}
    for name, hotkey in bindings.items():
        if not isinstance(name, str) or not name:
            raise HotkeyBackendError(f"binding names must be non-empty strings, got {name!r}")
        result[name] = hotkey if isinstance(hotkey, Hotkey) else parse_hotkey(hotkey)
    return result


class HotkeyBackend(abc.ABC):
    """One way of receiving global key presses (pynput, evdev, desktop portal)."""

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self._on_event: EventCallback | None = None
        self._on_error: ErrorCallback | None = None
        self._stopped = threading.Event()
        self._stopped.set()
        self._ready = threading.Event()
        self.bindings: dict[str, Hotkey] = {}
        self._disabled: frozenset[str] = frozenset()
        self._pressed: set[str] = set()  # reported pressed, not released yet (the backend's thread)
        self._enable_lock = threading.Lock()

    @abc.abstractmethod
    def is_available(self) -> tuple[bool, str]:
        """(True, what it will use) or (False, one line saying why not and how to fix it)."""

    @abc.abstractmethod
    def _start(self) -> None:
        """Begin listening for ``self.bindings``; must not block."""

    @abc.abstractmethod
    def _stop(self) -> None:
        """Release every resource; join the backend's threads (unless called from one of them)."""

    def start(
        self,
        bindings: Mapping[str, Hotkey | str],
        on_event: EventCallback,
        on_error: ErrorCallback | None = None,
        *,
        disabled: Iterable[str] = (),
    ) -> None:
        if self.running:
            raise HotkeyBackendError(f"the {self.name} hotkey backend is already running", backend=self.name)
        self.bindings = normalise_bindings(bindings)
        self._disabled = frozenset(disabled)
        self._pressed = set()
        self._on_event, self._on_error = on_event, on_error
        self._ready.clear()
        self._stopped.clear()
        try:
            self._start()
        except BaseException:
            self._stopped.set()
            raise

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._stop()

    @property
    def running(self) -> bool:
        return not self._stopped.is_set()

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Report binding ``name`` (and, for grabbing backends, take its key) only while enabled."""
        with self._enable_lock:
            before = self._disabled
            self._disabled = before - {name} if enabled else before | {name}  # readers see old or new set
        if self._disabled != before and self.running:
            self._enabled_changed(name, enabled)

    def is_enabled(self, name: str) -> bool:
        return name not in self._disabled

    def _enabled_changed(self, name: str, enabled: bool) -> None:  # noqa: B027 - an optional hook
        """Hook for backends that act on it (called from the caller's thread while running)."""

    def wait_ready(self, timeout: float) -> bool:
        """Block until hotkeys are live (listener attached, devices open, shortcuts bound)."""
        return self._ready.wait(timeout)

    # Helpers for subclasses, called on the backend's thread.
    def _emit(self, events: Iterable[tuple[str, bool]]) -> None:
        for name, pressed in events:
            if self._stopped.is_set() or self._on_event is None:
                return
            if name in self._disabled and (pressed or name not in self._pressed):
                continue
            (self._pressed.add if pressed else self._pressed.discard)(name)
            try:
                self._on_event(name, pressed)
            except Exception:
                log.exception("hotkey callback failed for %s (%s)", name, "press" if pressed else "release")

    def _report(self, message: str, *, fatal: bool) -> None:
        error = HotkeyBackendError(message, backend=self.name, fatal=fatal)
        (log.error if fatal else log.warning)("%s hotkeys: %s", self.name, message)
        if self._stopped.is_set() or self._on_error is None:
            return
        try:
            self._on_error(error)
        except Exception:
            log.exception("hotkey error callback failed")
