"""Which kind of desktop session we are in: platform, X11 or Wayland, and which compositor.

Only environment variables are read (no tools are run), so detection is instant and testable with
a plain dict:

- Wayland: `WAYLAND_DISPLAY` set, or `XDG_SESSION_TYPE=wayland`. `DISPLAY` is usually set as well
  (XWayland), so a Wayland session wins over `DISPLAY` unless `XDG_SESSION_TYPE=x11` says otherwise.
- X11: `DISPLAY` set (or `XDG_SESSION_TYPE=x11`).
- Desktop/compositor: `HYPRLAND_INSTANCE_SIGNATURE` (Hyprland), `SWAYSOCK` (Sway), `NIRI_SOCKET`
  (niri), else `XDG_CURRENT_DESKTOP` (a colon-separated list such as "ubuntu:GNOME"), then
  `XDG_SESSION_DESKTOP` / `DESKTOP_SESSION`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

# Compositors built on wlroots (or otherwise offering zwp_virtual_keyboard_manager_v1), where wtype works.
WLROOTS_DESKTOPS = frozenset(
    {"sway", "hyprland", "river", "wayfire", "labwc", "dwl", "hikari", "qtile", "cage", "niri", "swayfx"}
)
# Desktops known to lack the virtual-keyboard protocol (atx/wtype#29, #34; voxtype#85).
NO_VIRTUAL_KEYBOARD_DESKTOPS = frozenset({"gnome", "kde", "cosmic", "budgie", "pantheon", "unity"})

_DESKTOP_ALIASES = {
    "gnome": "gnome",
    "gnome-classic": "gnome",
    "gnome-flashback": "gnome",
    "ubuntu": "gnome",  # "ubuntu:GNOME"; the next entry of the list usually says GNOME anyway
    "pop": "gnome",
    "kde": "kde",
    "plasma": "kde",
    "plasmawayland": "kde",
    "sway": "sway",
    "swayfx": "sway",
    "hyprland": "hyprland",
    "river": "river",
    "wayfire": "wayfire",
    "labwc": "labwc",
    "niri": "niri",
    "dwl": "dwl",
    "hikari": "hikari",
    "qtile": "qtile",
    "cosmic": "cosmic",
    "budgie": "budgie",
    "budgie-desktop": "budgie",
    "pantheon": "pantheon",
    "unity": "unity",
    "xfce": "xfce",
    "x-cinnamon": "cinnamon",
    "cinnamon": "cinnamon",
    "mate": "mate",
    "lxqt": "lxqt",
    "lxde": "lxde",
    "i3": "i3",
}


@dataclass(frozen=True)
class Session:
    """Where text has to go. `kind` is one of "x11", "wayland", "windows", "macos", "none"."""

    kind: str
    desktop: str | None = None  # normalised: "gnome", "kde", "sway", "hyprland", ... or None if unknown
    display: str | None = None  # DISPLAY (X11 / XWayland)
    wayland_display: str | None = None

    @property
    def is_linux(self) -> bool:
        return self.kind in ("x11", "wayland", "none")

    @property
    def wlroots(self) -> bool:
        return self.desktop in WLROOTS_DESKTOPS

    def describe(self) -> str:
        parts = [self.kind]
        if self.desktop:
            parts.append(self.desktop)
        if self.kind == "x11" and self.display:
            parts.append(f"DISPLAY={self.display}")
        if self.kind == "wayland" and self.wayland_display:
            parts.append(f"WAYLAND_DISPLAY={self.wayland_display}")
        return ", ".join(parts)


def detect_session(environment: Mapping[str, str], platform: str | None = None) -> Session:
    """Classify the session from environment variables (`platform` defaults to `sys.platform`)."""
    platform = sys.platform if platform is None else platform
    if platform.startswith("win") or platform == "cygwin":
        return Session("windows")
    if platform == "darwin":
        return Session("macos")

    env = {k: v for k, v in environment.items() if v}
    session_type = env.get("XDG_SESSION_TYPE", "").lower()
    display = env.get("DISPLAY")
    wayland_display = env.get("WAYLAND_DISPLAY")
    desktop = detect_desktop(env)

    if session_type == "x11" and display:
        kind = "x11"
    elif wayland_display or session_type == "wayland":
        kind = "wayland"
    elif display:
        kind = "x11"
    else:
        kind = "none"
    return Session(kind, desktop, display, wayland_display)


def detect_desktop(environment: Mapping[str, str]) -> str | None:
    """The normalised desktop/compositor name, or None when nothing says."""
    if environment.get("HYPRLAND_INSTANCE_SIGNATURE"):
        return "hyprland"
    if environment.get("SWAYSOCK"):
        return "sway"
    if environment.get("NIRI_SOCKET"):
        return "niri"
    for var in ("XDG_CURRENT_DESKTOP", "XDG_SESSION_DESKTOP", "DESKTOP_SESSION"):
        names = [n.strip().lower() for n in environment.get(var, "").split(":") if n.strip()]
        known = [_DESKTOP_ALIASES[n] for n in names if n in _DESKTOP_ALIASES]
        if known:
            return known[0]
        if names:
            return names[0]
    if environment.get("KDE_FULL_SESSION"):
        return "kde"
    return None
