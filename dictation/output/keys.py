"""Key senders: the tools that press the paste chord or type text.

| sender  | sessions             | chord | typing non-ASCII ("Grüße 你好")                            |
|---------|----------------------|-------|-------------------------------------------------------------|
| xdotool | X11                  | yes   | yes: binds the text's characters first (see x11keymap)      |
| wtype   | wlroots Wayland      | yes   | yes (uploads its own keymap); tested on headless sway       |
| ydotool | any (uinput, daemon) | yes   | no: US-layout keycodes for ASCII only, so it refuses        |
| pynput  | X11, Windows, macOS  | yes   | Windows/macOS yes; X11 no (repeats/drops chars), so refuses |

The text never goes on a command line (any local user can read those with ps): xdotool and ydotool
read it from stdin (`--file`), wtype too ("-"); xmodmap gets its key bindings on stdin as well.

Held modifiers (the hotkey's Ctrl/Shift/Alt/Super, still down when the text comes): xdotool, ydotool
and pynput send explicit key-ups for all of them first, so typed text does not turn into shortcuts;
wtype types on its own virtual keyboard, whose modifier state the physical keys do not touch, and
releases the chord's modifiers itself (Handy PR #1487); it waits WTYPE_SETTLE_MS after uploading
its keymap before the first key.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from typing import Protocol

from dictation.output.base import Availability, Chord, InjectionError
from dictation.output.environment import NO_VIRTUAL_KEYBOARD_DESKTOPS, Session
from dictation.output.process import Host, ProcResult
from dictation.output.x11keymap import KeymapBinder

log = logging.getLogger(__name__)


def pynput_installed() -> bool:
    return importlib.util.find_spec("pynput") is not None


class KeySender(Protocol):
    name: str
    unicode_typing: bool

    def check(self) -> Availability: ...

    def send_chord(self, chord: Chord) -> None: ...

    def type_text(self, text: str, delay_ms: int | None) -> None: ...

    def press_key(self, key: str, count: int) -> None: ...  # a key of `KEYS`, ``count`` times


# Keys a voice command presses (dictation/output/steps.py): our name -> each tool's name or code.
KEYS = ("enter", "tab", "backspace")
_X_KEYS = {"enter": "Return", "tab": "Tab", "backspace": "BackSpace"}  # X keysyms (xdotool, wtype)
DEFAULT_DELAY_MS = 12  # per key, where the tool has no keymap race
REMAP_DELAY_MS = 40  # xdotool remapping a keycode per character itself (e2e recipe §4)
# wtype uploads a new keymap per run; a key sent at once is lost (Qt 6 on sway 1.7 dropped the first
# key of every run: "Grüße" -> "rüße", and Ctrl+V did nothing). Waiting first fixed it here.
WTYPE_SETTLE_MS = 50


def _typing_timeout(base: float, text: str, delay_ms: int | None) -> float:
    return base + len(text) * ((delay_ms or DEFAULT_DELAY_MS) + 10) / 1000 * 2


def _raise_for(result: ProcResult, what: str, *, sent_if_ran: bool) -> None:
    """Turn a failed command into InjectionError. A tool that never started sent nothing; one that
    timed out may have sent part of it; other failures follow `sent_if_ran`."""
    if result.ok:
        return
    never_ran = result.returncode is None and not result.timed_out
    raise InjectionError(f"{what}: {result.failure()}", input_sent=result.timed_out or (sent_if_ran and not never_ran))


# Key-ups for every modifier, chained before each xdotool command. Not --clearmodifiers: that presses
# the modifiers again afterwards, and one the user let go of meanwhile then stays stuck down.
_XDOTOOL_RELEASE = (
    "keyup",
    *["Shift_L", "Shift_R", "Control_L", "Control_R", "Alt_L", "Alt_R", "Super_L", "Super_R", "ISO_Level3_Shift"],
)


class XdotoolKeys:
    name = "xdotool"
    unicode_typing = True
    _KEYS = {"v": "v", "insert": "Insert", "ctrl": "ctrl", "shift": "shift"}

    def __init__(self, host: Host, session: Session, *, forced: bool = False, timeout: float = 5.0):
        self.host, self.session, self.forced, self.timeout = host, session, forced, timeout
        self.keymap = KeymapBinder(host, timeout)

    def check(self) -> Availability:
        if not self.host.which("xdotool"):
            return Availability(False, "xdotool not installed")
        if self.session.kind == "wayland" and not self.forced:
            return Availability(False, "Wayland session: xdotool reaches only XWayland windows")
        if self.session.kind not in ("x11", "wayland") or not self.session.display:
            return Availability(False, "no X display (DISPLAY is not set)")
        return Availability(True, f"xdotool on {self.session.display}")

    def typing_caveat(self) -> str:
        return "" if self.keymap.available() else "no xmodmap: non-ASCII typing is timing-dependent"

    def flush(self) -> None:
        self.keymap.release_now()

    def send_chord(self, chord: Chord) -> None:
        keys = "+".join(self._KEYS[k] for k in (*chord.modifiers, chord.key))
        result = self.host.run(["xdotool", *_XDOTOOL_RELEASE, "key", keys], timeout=self.timeout)
        _raise_for(result, f"sending {chord.value}", sent_if_ran=False)

    def press_key(self, key: str, count: int) -> None:
        argv = ["xdotool", *_XDOTOOL_RELEASE, "key", "--delay", str(DEFAULT_DELAY_MS), "--repeat", str(count)]
        result = self.host.run([*argv, _X_KEYS[key]], timeout=_typing_timeout(self.timeout, " " * count, None))
        _raise_for(result, f"pressing {key}", sent_if_ran=True)

    def _type(self, text: str, delay_ms: int) -> None:
        # The text goes in on stdin ("--file -"), never on the command line, where every local user
        # could read it (ps, /proc/PID/cmdline). xdotool types a file exactly as it types an argument.
        argv = ["xdotool", *_XDOTOOL_RELEASE, "type", "--delay", str(delay_ms), "--file", "-"]
        result = self.host.run(argv, input=text.encode("utf-8"), timeout=_typing_timeout(self.timeout, text, delay_ms))
        _raise_for(result, "typing", sent_if_ran=True)

    def type_text(self, text: str, delay_ms: int | None) -> None:
        if text.isascii() or not self.keymap.available():
            fallback = DEFAULT_DELAY_MS if text.isascii() else REMAP_DELAY_MS
            self._type(text, fallback if delay_ms is None else delay_ms)
            return
        with self.keymap.lock:
            try:
                for i, (segment, chars) in enumerate(self.keymap.segments(text)):
                    bound = self.keymap.bind(chars)
                    delay = delay_ms if delay_ms is not None else DEFAULT_DELAY_MS if bound else REMAP_DELAY_MS
                    try:
                        self._type(segment, delay)
                    except InjectionError as exc:
                        exc.input_sent = exc.input_sent or i > 0
                        raise
                    self.keymap.mark_used()
            finally:
                self.keymap.release_later()


class WtypeKeys:
    name = "wtype"
    unicode_typing = True

    def __init__(self, host: Host, session: Session, *, forced: bool = False, timeout: float = 5.0):
        self.host, self.session, self.forced, self.timeout = host, session, forced, timeout

    def check(self) -> Availability:
        if not self.host.which("wtype"):
            return Availability(False, "wtype not installed")
        if self.session.kind != "wayland" and not self.forced:
            return Availability(False, "not a Wayland session")
        if not self.session.wayland_display:
            return Availability(False, "WAYLAND_DISPLAY is not set")
        if self.session.desktop in NO_VIRTUAL_KEYBOARD_DESKTOPS and not self.forced:
            return Availability(
                False, f"{self.session.desktop} has no virtual-keyboard protocol, wtype cannot send keys there"
            )
        if self.session.wlroots:
            return Availability(True, f"wtype on {self.session.desktop}")
        return Availability(True, f"wtype (compositor {self.session.desktop or 'unknown'}: needs virtual-keyboard)")

    def send_chord(self, chord: Chord) -> None:
        argv = ["wtype", "-s", str(WTYPE_SETTLE_MS)]
        for mod in chord.modifiers:
            argv += ["-M", mod]
        argv += ["-k", {"v": "v", "insert": "Insert"}[chord.key]]
        for mod in reversed(chord.modifiers):
            argv += ["-m", mod]
        _raise_for(self.host.run(argv, timeout=self.timeout), f"sending {chord.value}", sent_if_ran=False)

    def press_key(self, key: str, count: int) -> None:
        argv = ["wtype", "-s", str(WTYPE_SETTLE_MS)]
        for _ in range(count):
            argv += ["-k", _X_KEYS[key]]
        timeout = _typing_timeout(self.timeout, " " * count, None) + WTYPE_SETTLE_MS / 1000
        _raise_for(self.host.run(argv, timeout=timeout), f"pressing {key}", sent_if_ran=True)

    def type_text(self, text: str, delay_ms: int | None) -> None:
        # "-" reads the text from stdin, so text starting with "-" is not taken for an option.
        delay = DEFAULT_DELAY_MS if delay_ms is None else delay_ms
        result = self.host.run(
            ["wtype", "-s", str(WTYPE_SETTLE_MS), "-d", str(delay), "-"],
            input=text.encode("utf-8"),
            timeout=_typing_timeout(self.timeout, text, delay_ms) + WTYPE_SETTLE_MS / 1000,
        )
        _raise_for(result, "typing", sent_if_ran=True)


# Linux input-event codes (linux/input-event-codes.h).
_EV = {"ctrl": 29, "shift": 42, "v": 47, "insert": 110, "enter": 28, "tab": 15, "backspace": 14}
_ALL_MODIFIERS = (29, 97, 42, 54, 56, 100, 125, 126)  # L/R ctrl, shift, alt, meta


class YdotoolKeys:
    """ydotool >= 1.0 through its daemon ydotoold (uinput: needs access to /dev/uinput)."""

    name = "ydotool"
    unicode_typing = False

    def __init__(self, host: Host, session: Session, *, forced: bool = False, timeout: float = 5.0):
        self.host, self.session, self.forced, self.timeout = host, session, forced, timeout

    def socket_candidates(self) -> list[str]:
        env = self.host.environment
        if env.get("YDOTOOL_SOCKET"):
            return [env["YDOTOOL_SOCKET"]]
        paths = [f"{env['XDG_RUNTIME_DIR']}/.ydotool_socket"] if env.get("XDG_RUNTIME_DIR") else []
        return paths + ["/tmp/.ydotool_socket"]

    def check(self) -> Availability:
        if not self.session.is_linux:
            return Availability(False, "ydotool is Linux-only")
        if not self.host.which("ydotool"):
            return Availability(False, "ydotool not installed")
        sockets = self.socket_candidates()
        if not any(self.host.exists(p) for p in sockets):
            return Availability(False, f"ydotoold is not running (no socket at {' or '.join(sockets)})")
        return Availability(
            True, "ydotool via ydotoold (physical keycodes: assumes a layout with V where QWERTY has it)"
        )

    def _key(self, codes: list[str], what: str) -> None:
        result = self.host.run(["ydotool", "key", *codes], timeout=self.timeout)
        _raise_for(result, what, sent_if_ran=False)

    def send_chord(self, chord: Chord) -> None:
        release_all = [f"{c}:0" for c in _ALL_MODIFIERS]
        mods = [_EV[m] for m in chord.modifiers]
        key = _EV[chord.key]
        codes = [f"{c}:1" for c in mods] + [f"{key}:1", f"{key}:0"] + [f"{c}:0" for c in reversed(mods)]
        self._key(release_all + codes, f"sending {chord.value}")

    def press_key(self, key: str, count: int) -> None:
        code = _EV[key]
        self._key([f"{c}:0" for c in _ALL_MODIFIERS] + [f"{code}:1", f"{code}:0"] * count, f"pressing {key}")

    def type_text(self, text: str, delay_ms: int | None) -> None:
        if not text.isascii():
            raise InjectionError("ydotool types US-layout keycodes only and cannot type non-ASCII characters")
        self._key([f"{c}:0" for c in _ALL_MODIFIERS], "releasing modifiers")
        # On stdin, never on the command line. "/dev/stdin", not "-": early ydotool 1.0 releases open the
        # path they are given ("-" would be a file of that name); later versions read fd 0 for "-".
        result = self.host.run(
            [
                "ydotool",
                "type",
                "--key-delay",
                str(DEFAULT_DELAY_MS if delay_ms is None else delay_ms),
                "--file",
                "/dev/stdin",
            ],
            input=text.encode("utf-8"),
            timeout=_typing_timeout(self.timeout, text, delay_ms),
        )
        _raise_for(result, "typing", sent_if_ran=True)


class PynputKeys:
    """pynput's Controller. On X11 it uses the process's own DISPLAY (python-xlib reads os.environ)."""

    name = "pynput"

    def __init__(self, host: Host, session: Session, *, forced: bool = False, timeout: float = 5.0):
        self.host, self.session, self.forced, self.timeout = host, session, forced, timeout

    @property
    def unicode_typing(self) -> bool:
        # KEYEVENTF_UNICODE on Windows and CGEvent strings on macOS carry any character; on X11 pynput
        # reuses a remapped keycode before the client re-reads the map ("你好" -> "你你", e2e recipe §4).
        return self.session.kind in ("windows", "macos")

    def check(self) -> Availability:
        if not pynput_installed():
            return Availability(False, "pynput is not installed")
        if self.session.kind == "wayland" and not self.forced:
            return Availability(False, "Wayland session: pynput reaches only XWayland windows")
        if self.session.kind == "none" or (self.session.is_linux and not self.session.display):
            return Availability(False, "no X display (DISPLAY is not set)")
        return Availability(True, f"pynput ({self.session.kind})")

    def _controller(self):
        try:
            from pynput.keyboard import Controller, Key
        except Exception as exc:  # pynput raises ImportError subclasses and Xlib errors without a display
            raise InjectionError(f"pynput unusable: {exc}") from exc
        try:
            return Controller(), Key
        except Exception as exc:
            raise InjectionError(f"pynput unusable: {exc}") from exc

    def _release_modifiers(self, kb, Key) -> None:
        for mod in (Key.ctrl, Key.shift, Key.alt, Key.cmd):
            kb.release(mod)

    def send_chord(self, chord: Chord) -> None:
        kb, Key = self._controller()
        names = {"ctrl": Key.ctrl, "shift": Key.shift, "cmd": Key.cmd, "insert": Key.insert, "v": "v"}
        try:
            self._release_modifiers(kb, Key)
            mods = [names[m] for m in chord.modifiers]
            for m in mods:
                kb.press(m)
            kb.tap(names[chord.key])
            for m in reversed(mods):
                kb.release(m)
        except Exception as exc:
            raise InjectionError(f"pynput: sending {chord.value} failed: {exc}", input_sent=True) from exc

    def press_key(self, key: str, count: int) -> None:
        kb, Key = self._controller()
        try:
            self._release_modifiers(kb, Key)
            for _ in range(count):
                kb.tap(getattr(Key, key))
                time.sleep(DEFAULT_DELAY_MS / 1000)
        except Exception as exc:
            raise InjectionError(f"pynput: pressing {key} failed: {exc}", input_sent=True) from exc

    def type_text(self, text: str, delay_ms: int | None) -> None:
        if not self.unicode_typing and not text.isascii():
            raise InjectionError(f"pynput cannot type non-ASCII characters reliably on {self.session.kind}")
        kb, Key = self._controller()
        try:
            self._release_modifiers(kb, Key)
            for ch in text:
                kb.type(ch)
                time.sleep((DEFAULT_DELAY_MS if delay_ms is None else delay_ms) / 1000)
        except Exception as exc:
            raise InjectionError(f"pynput: typing failed: {exc}", input_sent=True) from exc
