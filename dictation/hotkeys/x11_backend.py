"""x11 backend: take the hotkey away from every application with XGrabKey (X11 sessions).

Listening backends (pynput's XRecord, evdev) see the keys but cannot stop them: the focused window
gets them as well, so F9 typed ``^[[20~`` into a terminal, and a held Space whose Ctrl and Alt went
up first auto-repeated into the window. This backend grabs each hotkey on the root window instead,
so the X server gives its press, its repeats and its release to this app alone:

- One XGrabKey per key code of the main key, per modifier mask of the chord, per combination of the
  lock modifiers (Caps Lock, Num Lock, and Scroll Lock where the layout maps it to a modifier), so
  the hotkey works whatever locks are on. The other modifiers must be exactly the chord's: shift+F9
  does not fire F9 and stays with the application.
- A press of a grabbed chord makes the X server grab the whole keyboard for us until that key is
  released, whatever happens to the modifiers meanwhile (X delivers the key's release to the grab,
  also after Ctrl and Alt went up first). So the chord ends when its key is released, and what is
  pressed or released while it is held (auto-repeat, the modifiers' releases) never reaches the window.
  Another chord of ours still held then (Esc, then the hotkey, then Esc up) keeps the keyboard ours
  until its own key goes up: each chord ends at its own release. Other keys the grab takes meanwhile
  are counted (`keys_taken`): the output tells from it whether its own keys were taken (`output.hold`).
- XkbSetDetectableAutoRepeat: a held key then repeats as presses only, without the fake release
  before each one, so a held chord is one press and one release. Without XKB, a release directly
  followed by a press of the same key at the same server time is recognised as a repeat instead.
- Sided modifiers ("right_ctrl+space"): the core protocol has one Control modifier for both keys, so
  such chords are grabbed synchronously: the server holds the keyboard until we have looked at which
  keys are down, then hands the press back to the window (ReplayKeyboard) when it was the other side.
- A binding is grabbed only while it is enabled (`set_enabled`): the app enables the cancel key while
  it records, so Esc reaches applications the rest of the time.
- A chord that another program grabbed first (a window manager's or xbindkeys' shortcut) fails with
  BadAccess: it is left out, and one message names it (reported through ``on_error`` and kept in
  `problems`, which `dictation status` and the doctor show).
- A hotkey made only of modifiers ("right_ctrl") types nothing and does not auto-repeat, so there is
  nothing to keep from the window, while grabbing it would take Ctrl+C away from applications as long
  as it is held: such bindings are watched through pynput (XRecord) instead.
- A new keyboard mapping (setxkbmap, xmodmap) re-grabs everything; stop() releases every grab.
- A chord already held when the grabs are made (pressed while the app was starting) never
  activates them, and its release would go to the window: the backend sees it in the keyboard's
  state, takes the whole keyboard until its key goes up (as the server does for a grabbed press),
  reports the press at once and says, through ``on_error`` (not fatal), that it came before the
  app listened, so what was said before may be missing.

Each report comes with `event_time`: when the key went down or up, from the X server's stamp
(`event_time.server_time_to_clock`), which stays right while this thread waits for the GIL.

Everything X is done on the backend's own thread with its own connection; other threads only post
requests to it and wake it through a pipe. This module is that thread: its requests, the key events
and the state of the chords held; ``x11_keyboard.py`` reads the keyboard mapping (key codes, modifier
masks, locks) and ``x11_grabs.py`` makes and releases the grabs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
import time
from typing import Any

from dictation.hotkeys.base import HotkeyBackend
from dictation.hotkeys.errors import HotkeyBackendError
from dictation.hotkeys.event_time import server_time_to_clock
from dictation.hotkeys.hotkey import Hotkey
from dictation.hotkeys.x11_grabs import KeyGrabs, conflict_message, probe_grabs
from dictation.hotkeys.x11_keyboard import MODIFIER_BITS, Chord, Keyboard, is_down
from dictation.hotkeys.x11_xkb import connect, set_detectable_auto_repeat

log = logging.getLogger(__name__)

STOP_JOIN_S = 2.0
POLL_S = 1.0


class X11GrabBackend(HotkeyBackend):
    """See the module docstring. ``display_name`` defaults to $DISPLAY."""

    name = "x11"

    def __init__(self, display_name: str | None = None) -> None:
        super().__init__()
        self._display_name = display_name
        self._display: Any = None
        self._thread: threading.Thread | None = None
        self._requests: queue.Queue = queue.Queue()
        self._wake_r = self._wake_w = -1
        self._watcher: HotkeyBackend | None = None  # pynput, for modifier-only bindings
        self._problems: dict[str, str] = {}
        self.repeats_suppressed = 0
        self.keys_taken = 0  # presses of other keys our grab took from the windows (dictation.output.hold)
        self.detectable_auto_repeat = False
        # Thread state (the backend's thread only).
        self._chords: dict[str, Chord] = {}
        self._grabs = KeyGrabs()  # on the thread's connection, made at each start
        self._active: dict[str, tuple[int, int]] = {}  # pressed binding -> (keycode, matched mask)
        self._grab_key: int | None = None  # the key whose press made the server grab the keyboard for us
        self._keyboard_grabbed = False  # we took the keyboard (a chord held at start): let go at its release
        self._keyboard: Keyboard | None = None
        self._pushback: list[Any] = []
        self.event_time: float | None = None  # time.monotonic() of the key event being reported
        self.held_since: Any = None  # () -> the earliest a chord held at the start counts from (None: now)

    # -- availability --------------------------------------------------------------------------------
    def _target(self) -> str | None:
        return self._display_name or os.environ.get("DISPLAY") or None

    def is_available(self) -> tuple[bool, str]:
        try:
            import Xlib.display  # noqa: F401  (only whether python-xlib is there)
        except ImportError:
            return False, "the Python package 'python-xlib' is not installed (pip install python-xlib)"
        target = self._target()
        if not target:
            return False, "no X display (DISPLAY is unset)"
        try:
            display = connect(target)
        except Exception as exc:
            return False, f"cannot connect to the X display {target}: {exc}"
        display.close()
        return True, f"X11 key grabs on display {target}: the hotkey's keys reach this app only, not the focused window"

    @property
    def problems(self) -> list[str]:
        """One line per binding that can't be used (taken by another program, no such key)."""
        return list(self._problems.values())

    # -- lifecycle -----------------------------------------------------------------------------------
    def _start(self) -> None:
        target = self._target()
        if not target:
            raise HotkeyBackendError("no X display (DISPLAY is unset)", backend=self.name)
        try:
            self._display = connect(target)
        except Exception as exc:
            raise HotkeyBackendError(f"cannot connect to the X display {target}: {exc}", backend=self.name) from exc
        self._grabs = KeyGrabs(self._display)
        self._problems = {}
        self._requests = queue.Queue()
        self._wake_r, self._wake_w = os.pipe()
        modifier_only = {n: hk for n, hk in self.bindings.items() if hk.is_modifier_only}
        if modifier_only:
            self._start_watcher(modifier_only)
        self._thread = threading.Thread(target=self._run, name="hotkeys-x11", daemon=True)
        self._thread.start()

    def _start_watcher(self, bindings: dict[str, Hotkey]) -> None:
        from dictation.hotkeys.pynput_backend import PynputBackend

        watcher = PynputBackend()
        ok, reason = watcher.is_available()
        if not ok:
            for name, hotkey in bindings.items():
                self._problems[name] = f"{hotkey}: a hotkey made only of modifiers needs pynput here, but {reason}"
            return
        watcher.start(
            bindings,
            lambda name, pressed: self._emit([(name, pressed)]),
            lambda error: self._report(str(error), fatal=error.fatal),
        )
        self._watcher = watcher

    def _enabled_changed(self, name: str, enabled: bool) -> None:
        self._post(("enable", name, enabled))

    def settle(self, timeout: float = 5.0) -> bool:
        """Wait until the backend's thread has carried out every earlier request (`set_enabled`), so
        the grabs are in place on the server, and has handled every key event the server sent before
        (`keys_taken` counts them); False on timeout or when not running."""
        if not self.running or self._thread is None:
            return False
        done = threading.Event()
        self._post(("barrier", done))
        return done.wait(timeout)

    def _post(self, request: tuple) -> None:
        self._requests.put(request)
        with contextlib.suppress(OSError):  # stopped meanwhile
            os.write(self._wake_w, b"x")

    def _stop(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()
        thread = self._thread
        self._post(("stop",))
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_JOIN_S)
            if thread.is_alive():
                log.warning("the x11 hotkey thread did not stop within %.0f s", STOP_JOIN_S)
        self._thread = None

    # -- the backend's thread ------------------------------------------------------------------------
    def _run(self) -> None:
        display = self._display
        try:
            try:
                self._setup()
            finally:
                if self._watcher is not None:
                    self._watcher.wait_ready(10.0)
                self._ready.set()
            while not self._stopped.is_set():
                if self._handle_requests():
                    break
                while self._pushback or display.pending_events():
                    self._handle(self._pushback.pop(0) if self._pushback else display.next_event())
                ready, _, _ = select.select([display.fileno(), self._wake_r], [], [], POLL_S)
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
        except Exception as exc:
            if not self._stopped.is_set():
                self._report(f"the X11 key grabs stopped working: {type(exc).__name__}: {exc}", fatal=True)
        finally:
            self._cleanup()

    def _setup(self) -> None:
        display = self._display
        self.detectable_auto_repeat = set_detectable_auto_repeat(display)
        if not self.detectable_auto_repeat:
            log.info("x11 hotkeys: XKB detectable auto-repeat unavailable; recognising repeats by their timing")
        self._regrab(report=True)
        self._catch_held()

    def _catch_held(self) -> None:
        """A chord held down already (pressed before the grabs existed): report its press now and
        take the keyboard until its key goes up, so its release comes to us and not to the window."""
        from Xlib import X

        display = self._display
        keymap = display.query_keymap()
        root = display.screen().root
        state = root.query_pointer().mask  # the modifiers held now
        for chord in list(self._chords.values()):
            down = sorted(code for code in chord.keycodes if is_down(keymap, code))
            match = self._match(down[0], state) if down else None
            if match is None or match[0] != chord.name:
                continue
            if root.grab_keyboard(False, X.GrabModeAsync, X.GrabModeAsync, X.CurrentTime) != X.GrabSuccess:
                self._report(f"{chord.hotkey} was held down before the hotkeys were ready; it was missed", fatal=False)
                return
            self._keyboard_grabbed = True
            self._grab_key = down[0]
            self._active[chord.name] = (down[0], match[1])
            self._report(
                f"{chord.hotkey} was already held down when the app began listening: the recording starts now, "
                "so what was said before may be missing",
                fatal=False,
            )
            since = self.held_since() if self.held_since is not None else None  # when is not known
            self.event_time = since if since is not None else time.monotonic()
            self._emit([(chord.name, True)])
            return

    def _let_go_of_keyboard(self) -> None:
        from Xlib import X

        if self._keyboard_grabbed and self._display is not None:
            self._keyboard_grabbed = False
            self._display.ungrab_keyboard(X.CurrentTime)
            self._display.flush()

    def _regrab(self, report: bool) -> None:
        """(Re)build the chords from the current keyboard mapping and grab every enabled one."""
        self._grabs.ungrab_all()
        self._keyboard = Keyboard(self._display)
        self._chords = {}
        for name in [n for n, hk in self.bindings.items() if not hk.is_modifier_only]:
            self._problems.pop(name, None)
        for name, hotkey in self.bindings.items():
            if hotkey.is_modifier_only:
                continue
            try:
                self._chords[name] = self._keyboard.chord(name, hotkey)
            except HotkeyBackendError as exc:
                self._problems[name] = str(exc)
        for name in self._chords:
            if self.is_enabled(name):
                self._grab(name)
        if report:
            for message in self._problems.values():
                self._report(message, fatal=False)
            if self._grabs.empty and self._watcher is None and any(self.is_enabled(n) for n in self.bindings):
                self._report("no hotkey could be grabbed", fatal=True)

    def _grab(self, name: str) -> bool:
        """Grab one binding (x11_grabs.KeyGrabs.grab); a conflict is remembered in ``problems``."""
        chord = self._chords.get(name)
        if chord is None or self._keyboard is None:
            return False
        if self._grabs.grab(chord, self._keyboard):
            self._problems.pop(name, None)
            return True
        self._problems[name] = conflict_message(chord.hotkey, name)
        return False

    def _handle_requests(self) -> bool:
        """Carry out what other threads asked for; True on stop."""
        while True:
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                return False
            if request[0] == "stop":
                return True
            if request[0] == "barrier":
                self._display.sync()  # every event sent before it is in our queue now: handle them
                while self._pushback or self._display.pending_events():
                    self._handle(self._pushback.pop(0) if self._pushback else self._display.next_event())
                request[1].set()
                continue
            _, name, enabled = request
            if name not in self._chords:
                continue
            if enabled and self.is_enabled(name):
                known = self._problems.get(name)
                if not self._grab(name) and self._problems[name] != known:  # say it once, not at every recording
                    self._report(self._problems[name], fatal=False)
            elif not enabled and not self.is_enabled(name):
                self._grabs.ungrab(name)

    def _cleanup(self) -> None:
        from Xlib import X

        display, self._display = self._display, None
        try:
            if display is not None:
                try:
                    self._grabs.ungrab_all()
                    if self._keyboard_grabbed:
                        display.ungrab_keyboard(X.CurrentTime)
                    display.allow_events(X.AsyncKeyboard, X.CurrentTime)  # never leave the keyboard frozen
                    display.sync()
                finally:
                    display.close()
        except Exception:
            log.debug("closing the x11 hotkey connection failed", exc_info=True)
        self._grabs.forget()
        self._active.clear()
        self._grab_key = None
        self._keyboard_grabbed = False
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def _handle(self, event: Any) -> None:
        from Xlib import X

        if event.type == X.KeyPress:
            self._key_press(event)
        elif event.type == X.KeyRelease:
            self._key_release(event)
        elif event.type == X.MappingNotify and event.request in (X.MappingKeyboard, X.MappingModifier):
            self._display.refresh_keyboard_mapping(event)
            log.info("x11 hotkeys: the keyboard mapping changed; grabbing the hotkeys again")
            self._release_active()
            self._regrab(report=False)

    def _down(self) -> set[int]:
        return {keycode for keycode, _mask in self._active.values()}

    def _key_press(self, event: Any) -> None:
        from Xlib import X

        keycode = event.detail
        if keycode in self._down():
            self.repeats_suppressed += 1  # auto-repeat of a key we hold
            return
        activation = self._grab_key is None  # this press made the server grab the keyboard for us
        match = self._match(keycode, event.state)
        if activation:
            # Thaws a synchronous grab: keeps the keyboard, or gives the press to the window after all.
            self._display.allow_events(X.AsyncKeyboard if match else X.ReplayKeyboard, event.time)
            self._display.flush()
            holders = self._grabs.holders(keycode, event.state & MODIFIER_BITS)
            replayed = match is None and any(n in self._chords and self._chords[n].sync for n in holders)
            if not replayed:  # the keyboard is ours until this key goes up
                self._grab_key = keycode
        if match is None:
            if not activation:  # the keyboard was ours: the window never gets this key (ours, if we sent it)
                self.keys_taken += 1
            return
        name, mask = match
        self._active[name] = (keycode, mask)
        self.event_time = server_time_to_clock(event.time)
        self._emit([(name, True)])

    def _key_release(self, event: Any) -> None:
        keycode = event.detail
        if keycode not in self._down() and keycode != self._grab_key:
            return
        if not self.detectable_auto_repeat and self._is_fake_release(event):
            self.repeats_suppressed += 1
            return
        ended = [name for name, (code, _mask) in self._active.items() if code == keycode]
        if keycode == self._grab_key:  # the server ended its grab with this release
            self._grab_key = None
            ended += self._keep_held([name for name in self._active if name not in ended])
        for name in ended:
            del self._active[name]
        self.event_time = server_time_to_clock(event.time)
        self._emit([(name, False) for name in ended])

    def _keep_held(self, names: list[str]) -> list[str]:
        """The key that gave us the keyboard went up while the chords ``names`` are still held: take
        the keyboard until their keys go up too, so their releases come to us. Returns those that end
        now (their key is up already, or the keyboard could not be taken)."""
        from Xlib import X

        if names and not self._keyboard_grabbed:
            root = self._display.screen().root
            status = root.grab_keyboard(False, X.GrabModeAsync, X.GrabModeAsync, X.CurrentTime)
            self._keyboard_grabbed = status == X.GrabSuccess
        keymap = self._display.query_keymap() if names and self._keyboard_grabbed else None
        held = [name for name in names if keymap is not None and is_down(keymap, self._active[name][0])]
        if held:
            self._grab_key = self._active[held[0]][0]
        else:
            self._let_go_of_keyboard()
        return [name for name in names if name not in held]

    def _release_active(self) -> None:
        ended = list(self._active)
        self._active.clear()
        self._grab_key = None
        self._let_go_of_keyboard()
        self.event_time = time.monotonic()
        self._emit([(name, False) for name in ended])

    def _is_fake_release(self, event: Any) -> bool:
        """Without detectable auto-repeat, X sends a release and a press with the same time per repeat."""
        from Xlib import X

        if not self._pushback and not self._display.pending_events():
            return False
        following = self._pushback[0] if self._pushback else self._display.next_event()
        if not self._pushback:
            self._pushback.append(following)
        if following.type == X.KeyPress and following.detail == event.detail and following.time == event.time:
            self._pushback.pop(0)
            return True
        return False

    def _match(self, keycode: int, state: int) -> tuple[str, int] | None:
        """The enabled binding this press fires, with the mask it matched; modifiers held for a
        binding that is already pressed don't count against another (Esc while the chord is held)."""
        if self._keyboard is None:
            return None
        clean = state & MODIFIER_BITS & ~self._keyboard.lock_mask
        held = 0
        for _code, mask in self._active.values():
            held |= mask
        keymap = None
        for chord in self._chords.values():
            if keycode not in chord.keycodes or not self.is_enabled(chord.name) or chord.name in self._active:
                continue
            if chord.name in self._problems:
                continue
            for mask in chord.masks:
                if mask & ~clean or (clean & ~mask) & ~held:
                    continue
                if chord.sided:
                    keymap = keymap if keymap is not None else self._display.query_keymap()
                    if not all(any(is_down(keymap, code) for code in codes) for codes in chord.sided):
                        continue
                return chord.name, mask
        return None


__all__ = ["X11GrabBackend", "probe_grabs"]  # probe_grabs (x11_grabs.py): `dictation doctor` imports it from here
