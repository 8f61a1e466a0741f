"""Which window has focus, whether it is a terminal, and so which paste chord to send.

Window class sources: X11 `xdotool getwindowfocus` + `xprop WM_CLASS` (the focused client window;
`getactivewindow` needs a window manager with _NET_ACTIVE_WINDOW, so it is not used); Hyprland
`hyprctl activewindow -j`; Sway `swaymsg -t get_tree`. GNOME and KDE on Wayland do not tell other
programs which window is focused, so the class is unknown there.

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


@dataclass(frozen=True)
class WindowInfo:
    """The focused window as far as we can tell. `classes` holds WM_CLASS instance and class (X11),
    or the app_id / class (Wayland); empty when unknown."""

    id: str | None = None
    classes: tuple[str, ...] = ()
    note: str = ""

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


def _x11_focused(host: Host, timeout: float) -> WindowInfo:
    result = host.run(["xdotool", "getwindowfocus"], timeout=timeout)
    wid = result.text().strip()
    if not result.ok or not wid.isdigit():
        return WindowInfo(note=f"no focused window ({result.failure()})")
    if not host.which("xprop"):
        return WindowInfo(wid, note="xprop not installed")
    prop = host.run(["xprop", "-id", wid, "WM_CLASS"], timeout=timeout)
    classes = tuple(_WM_CLASS.findall(prop.text())) if prop.ok else ()
    return WindowInfo(wid, classes, "" if classes else "focused window has no WM_CLASS")


def _hyprland_focused(host: Host, timeout: float) -> WindowInfo:
    result = host.run(["hyprctl", "activewindow", "-j"], timeout=timeout)
    try:
        data = json.loads(result.text()) if result.ok else {}
    except json.JSONDecodeError:
        data = {}
    classes = tuple(c for c in (data.get("initialClass"), data.get("class")) if c) if isinstance(data, dict) else ()
    wid = data.get("address") if isinstance(data, dict) else None
    return WindowInfo(wid, classes, "" if classes else "hyprctl reported no active window")


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
            return WindowInfo(str(node.get("id")), classes)
        stack.extend(node.get("nodes", []) + node.get("floating_nodes", []))
    return WindowInfo(note="swaymsg reported no focused window")


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
