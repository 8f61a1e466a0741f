"""Which window has focus, whether it is a terminal, and so which paste chord to send.

Window class sources: X11 `xdotool getwindowfocus` + `xprop WM_CLASS _NET_WM_PID` (the focused
client window; `getactivewindow` needs a window manager with _NET_ACTIVE_WINDOW, so it is not used);
Hyprland `hyprctl activewindow -j`; Sway `swaymsg -t get_tree`. GNOME and KDE on Wayland do not
tell other programs which window is focused, so the class is unknown there.

Each probe also says whether *no* window has the keyboard focus (`WindowInfo.nothing_focused`:
X11 focus on None, PointerRoot or the root window; an empty workspace on Sway; no active window on
Hyprland), as opposed to a probe that could not tell, and gives the focused window's process id
where the desktop names it (`pid`), so `focus.FocusGuard` can refuse to send text into nothing or
into our own windows.

Chord rule (paste_chord="auto"): a known terminal gets Ctrl+Shift+V (xterm and rxvt, which bind no
such key, get Shift+Insert); any other known window gets Ctrl+V; an unknown window gets Shift+Insert
with CLIPBOARD and PRIMARY both set, which GTK, Qt, browsers and terminals all treat as paste.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from dictation.output.base import Chord
from dictation.output.environment import Session
from dictation.output.process import Host

# Window classes / app_ids of terminals (lower-case; compared with both WM_CLASS fields).
TERMINAL_CLASSES = frozenset(
    {
        "gnome-terminal", "gnome-terminal-server", "org.gnome.terminal", "org.gnome.console", "kgx",
        "org.gnome.ptyxis", "ptyxis", "konsole", "org.kde.konsole", "yakuake", "kitty", "alacritty",
        "foot", "footclient", "wezterm", "org.wezfurlong.wezterm", "tilix", "com.gexperts.tilix",
        "terminator", "xfce4-terminal", "mate-terminal", "lxterminal", "qterminal", "terminology",
        "st", "st-256color", "ghostty", "com.mitchellh.ghostty", "warp", "dev.warp.warp", "tabby",
        "hyper", "contour", "rio", "blackbox", "com.raggesilver.blackbox", "cool-retro-term", "guake",
        "tilda", "sakura", "roxterm", "deepin-terminal", "eterm", "kermit", "zutty", "cosmic-term",
        "com.system76.cosmicterm", "io.elementary.terminal", "x-terminal-emulator",
    }
)  # fmt: skip
# Terminals whose paste key is Shift+Insert (PRIMARY) rather than Ctrl+Shift+V.
SHIFT_INSERT_TERMINALS = frozenset({"xterm", "uxterm", "rxvt", "urxvt", "rxvt-unicode", "urxvt-256color", "aterm"})

_WM_CLASS = re.compile(r'"((?:[^"\\]|\\.)*)"')
_NET_WM_PID = re.compile(r"^_NET_WM_PID\(CARDINAL\) = (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class WindowInfo:
    """The focused window as far as we can tell. `classes` holds WM_CLASS instance and class (X11),
    or the app_id / class (Wayland); empty when unknown."""

    id: str | None = None
    classes: tuple[str, ...] = ()
    note: str = ""
    pid: int | None = None  # the process owning the window, where the desktop says (_NET_WM_PID, swaymsg, hyprctl)
    nothing_focused: bool = False  # the desktop answered that no window has the keyboard focus

    @property
    def label(self) -> str | None:
        return self.classes[-1] if self.classes else None


def focused_window(session: Session, host: Host, timeout: float = 2.0) -> WindowInfo:
    """Best-effort probe of the focused window; never raises."""
    if session.kind == "x11" and host.which("xdotool"):
        return _x11_focused(host, timeout)
    if session.kind == "wayland" and session.desktop == "hyprland" and host.which("hyprctl"):
        return _hyprland_focused(host, timeout)
    if session.kind == "wayland" and session.desktop == "sway" and host.which("swaymsg"):
        return _sway_focused(host, timeout)
    return WindowInfo(note=f"cannot ask {session.desktop or session.kind} for the focused window")


# xdotool's words when the X focus is None or PointerRoot (`getwindowfocus` exits 1 after them).
_X_NO_FOCUS = ("focused window of 1.", "focused window of 0.", "xdo_get_focused_window_sane failed")


def _x11_focused(host: Host, timeout: float) -> WindowInfo:
    result = host.run(["xdotool", "getwindowfocus"], timeout=timeout)
    wid = result.text().strip()
    if not result.ok or not wid.isdigit():
        if any(words in result.stderr.decode("utf-8", "replace") for words in _X_NO_FOCUS):
            return WindowInfo(note="no window has the keyboard focus", nothing_focused=True)
        return WindowInfo(note=f"no focused window ({result.failure()})")
    if not host.which("xprop"):
        return WindowInfo(wid, note="xprop not installed")
    prop = host.run(["xprop", "-id", wid, "WM_CLASS", "_NET_WM_PID"], timeout=timeout)
    text = prop.text() if prop.ok else ""
    class_line = next((line for line in text.splitlines() if line.startswith("WM_CLASS")), "")
    classes = tuple(_WM_CLASS.findall(class_line))
    pid = _NET_WM_PID.search(text)
    info = WindowInfo(wid, classes, "" if classes else "focused window has no WM_CLASS", int(pid[1]) if pid else None)
    if not classes and pid is None and _is_root(host, wid, timeout):
        return WindowInfo(wid, note="the keyboard focus is on the root window", nothing_focused=True)
    return info


def _is_root(host: Host, wid: str, timeout: float) -> bool:
    """Whether `wid` is the root window (focus there reaches no application window)."""
    if not host.which("xwininfo"):
        return False
    result = host.run(["xwininfo", "-id", wid], timeout=timeout)
    return result.ok and "(the root window)" in result.text()


def _hyprland_focused(host: Host, timeout: float) -> WindowInfo:
    result = host.run(["hyprctl", "activewindow", "-j"], timeout=timeout)
    try:
        data = json.loads(result.text()) if result.ok else {}
    except json.JSONDecodeError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    classes = tuple(c for c in (data.get("initialClass"), data.get("class")) if c)
    wid = data.get("address")
    pid = data.get("pid") if isinstance(data.get("pid"), int) and data.get("pid") > 0 else None
    # `activewindow -j` answers {} when no window is active; an error or garbage says nothing.
    nothing = result.ok and data == {} and result.text().strip().startswith("{")
    return WindowInfo(wid, classes, "" if classes else "hyprctl reported no active window", pid, nothing)


def _sway_focused(host: Host, timeout: float) -> WindowInfo:
    result = host.run(["swaymsg", "-t", "get_tree"], timeout=timeout)
    try:
        tree = json.loads(result.text()) if result.ok else {}
    except json.JSONDecodeError:
        tree = {}
    stack = [tree] if isinstance(tree, dict) else []
    while stack:
        node = stack.pop()
        if node.get("focused") and node.get("type") in ("con", "floating_con"):
            props = node.get("window_properties") or {}
            classes = tuple(c for c in (node.get("app_id"), props.get("instance"), props.get("class")) if c)
            pid = node.get("pid") if isinstance(node.get("pid"), int) and node.get("pid") > 0 else None
            return WindowInfo(str(node.get("id")), classes, pid=pid)
        stack.extend(node.get("nodes", []) + node.get("floating_nodes", []))
    # A tree without a focused window: the focus is on a workspace (an empty one) or nowhere.
    return WindowInfo(note="swaymsg reported no focused window", nothing_focused=bool(tree))


def terminal_kind(window: WindowInfo, extra_terminals: tuple[str, ...] = ()) -> str | None:
    """ "shift-insert" for xterm-like terminals, "terminal" for the others, None for non-terminals."""
    names = {c.lower() for c in window.classes}
    if names & SHIFT_INSERT_TERMINALS:
        return "shift-insert"
    if names & (TERMINAL_CLASSES | {t.lower() for t in extra_terminals}):
        return "terminal"
    return None


def choose_chord(
    policy: str, session: Session, window: WindowInfo, extra_terminals: tuple[str, ...] = ()
) -> tuple[Chord, str]:
    """The chord to send and a few words on why."""
    if session.kind == "macos":
        return Chord.CMD_V, "macOS"
    if policy != "auto":
        return Chord(policy), "set in settings"
    if session.kind == "windows":
        return Chord.CTRL_V, "Windows"
    kind = terminal_kind(window, extra_terminals)
    if kind == "shift-insert":
        return Chord.SHIFT_INSERT, f"{window.label} pastes PRIMARY with Shift+Insert"
    if kind == "terminal":
        return Chord.CTRL_SHIFT_V, f"terminal {window.label}"
    if window.classes:
        return Chord.CTRL_V, f"window {window.label}"
    return Chord.SHIFT_INSERT, f"window class unknown ({window.note})"
