"""Pick the hotkey backend for this session, and say why the others aren't used.

Order (the first available wins; no silent fallback from a backend the user named):

- Windows, macOS: pynput.
- Linux, Wayland: the GlobalShortcuts portal, else evdev (needs the `input` group). Not pynput:
  under Wayland its X11 hooks only see keys typed into XWayland windows.
- Linux, X11: x11 (XGrabKey: the hotkey never reaches the focused window), else pynput, else evdev,
  else the portal.
- Linux console (no display): evdev.

When nothing works, the explanation points to `dictation toggle` / `start` / `stop`, which any
compositor or hotkey daemon can bind.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

from dictation.hotkeys.base import HotkeyBackend
from dictation.hotkeys.errors import HotkeyError

BACKEND_NAMES = ("portal", "evdev", "x11", "pynput")
PREFERENCES = ("auto", *BACKEND_NAMES, "none")

COMMANDS_HINT = (
    "Bind the app's commands to a key in your desktop or compositor instead: `dictation toggle` on one key, "
    "or for push-to-talk `dictation start` on press and `dictation stop` on release (Sway: "
    "`bindsym --no-repeat F9 exec dictation start` + `bindsym --release F9 exec dictation stop`; Hyprland: "
    "`bind = , F9, exec, dictation start` + `bindr = , F9, exec, dictation stop`; GNOME/KDE custom shortcuts "
    "can run `dictation toggle`)."
)


class Environment(NamedTuple):  # records, not dataclasses: imported before the hotkey grab (dictation.launch)
    """What kind of session we run in, from the environment variables (injectable for tests)."""

    platform: str  # sys.platform
    session: str  # "wayland", "x11", "console", "windows", "macos"
    desktop: str = ""

    @classmethod
    def detect(cls, env: Mapping[str, str] | None = None, platform: str | None = None) -> Environment:
        env = os.environ if env is None else env
        platform = sys.platform if platform is None else platform
        if platform == "win32":
            return cls(platform, "windows")
        if platform == "darwin":
            return cls(platform, "macos")
        kind = env.get("XDG_SESSION_TYPE", "").lower()
        if kind == "wayland" or (kind != "x11" and env.get("WAYLAND_DISPLAY")):
            session = "wayland"
        elif kind == "x11" or env.get("DISPLAY"):
            session = "x11"
        else:
            session = "console"
        desktop = env.get("XDG_CURRENT_DESKTOP", "")
        for variable, name in (
            ("HYPRLAND_INSTANCE_SIGNATURE", "Hyprland"),
            ("SWAYSOCK", "sway"),
            ("NIRI_SOCKET", "niri"),
        ):
            if not desktop and env.get(variable):
                desktop = name
        return cls(platform, session, desktop)

    @property
    def label(self) -> str:
        base = {
            "wayland": "Wayland session",
            "x11": "X11 session",
            "console": "Linux console (no display server)",
            "windows": "Windows",
            "macos": "macOS",
        }[self.session]
        return f"{base} ({self.desktop})" if self.desktop else base


def candidate_order(environment: Environment) -> tuple[list[str], dict[str, str]]:
    """Backends to try in order, and why the rest are not considered here."""
    if environment.session in ("windows", "macos"):
        return ["pynput"], {
            "portal": "only on Linux desktops",
            "evdev": "exists only on Linux",
            "x11": "only in X11 sessions",
        }
    if environment.session == "wayland":
        return ["portal", "evdev"], {
            "x11": "on Wayland X11 key grabs only catch keys typed into XWayland windows",
            "pynput": "on Wayland its X11 hooks only see keys typed into XWayland windows",
        }
    if environment.session == "x11":
        return ["x11", "pynput", "evdev", "portal"], {}
    return ["evdev"], {
        "x11": "no display server (DISPLAY is unset)",
        "pynput": "no display server (DISPLAY is unset)",
        "portal": "no graphical session",
    }


def default_factories() -> dict[str, Callable[[], HotkeyBackend]]:
    from dictation.hotkeys.evdev_backend import EvdevBackend
    from dictation.hotkeys.portal import PortalBackend
    from dictation.hotkeys.pynput_backend import PynputBackend
    from dictation.hotkeys.x11_backend import X11GrabBackend

    return {"portal": PortalBackend, "evdev": EvdevBackend, "x11": X11GrabBackend, "pynput": PynputBackend}


class BackendChoice(NamedTuple):
    backend: HotkeyBackend | None
    environment: Environment
    preference: str
    notes: tuple[tuple[str, str], ...]  # (backend name, why it is / isn't used), chosen one first
    # (available, reason) of each backend choose_backend asked, by name
    probed: Mapping[str, tuple[bool, str]] = MappingProxyType({})

    @property
    def name(self) -> str:
        return self.backend.name if self.backend else "none"

    def describe(self) -> str:
        """A short report for the log, the settings window and `dictation` diagnostics."""
        where = self.environment.label
        if self.backend is not None:
            how = "chosen in settings" if self.preference != "auto" else "picked automatically"
            head = f"Hotkeys: {self.backend.name} ({how}; {where}) — {self.notes[0][1]}."
            rest = self.notes[1:]
        elif self.preference == "none":
            return f"Hotkeys: off (chosen in settings). {COMMANDS_HINT}"
        elif self.preference != "auto":
            head = f"Hotkeys: none — {self.preference} was chosen in settings but can't be used ({where})."
            rest = self.notes
        else:
            head = f"Hotkeys: none of the global hotkey backends works in this {where}."
            rest = self.notes
        lines = [head, *(f"  {name}: {why}" for name, why in rest)]
        if self.backend is None:
            lines.append(COMMANDS_HINT)
        return "\n".join(lines)


def choose_backend(
    preference: str = "auto",
    *,
    environment: Environment | None = None,
    factories: Mapping[str, Callable[[], HotkeyBackend]] | None = None,
) -> BackendChoice:
    """Return the backend to use (not started) with the reasons for the others."""
    preference = (preference or "auto").strip().lower()
    if preference not in PREFERENCES:
        raise HotkeyError(f"unknown hotkey backend {preference!r} — choose one of {', '.join(PREFERENCES)}")
    environment = environment or Environment.detect()
    if preference == "none":
        return BackendChoice(None, environment, preference, ())
    factories = default_factories() if factories is None else factories
    order, excluded = candidate_order(environment)
    if preference != "auto":
        order = [preference]
        excluded = {}
    notes: list[tuple[str, str]] = []
    probed: dict[str, tuple[bool, str]] = {}
    chosen: HotkeyBackend | None = None
    for name in order:
        if chosen is not None:
            notes.append((name, f"not tried: {chosen.name} comes first here"))
            continue
        backend = factories[name]()
        ok, reason = probed[name] = backend.is_available()
        if ok:
            chosen = backend
            notes.insert(0, (name, reason))
        else:
            notes.append((name, f"unavailable — {reason}"))
    notes += [(name, f"not used — {why}") for name, why in excluded.items()]
    return BackendChoice(chosen, environment, preference, tuple(notes), probed)


def backend_availability(
    choice: BackendChoice, factories: Mapping[str, Callable[[], HotkeyBackend]] | None = None
) -> dict[str, tuple[bool | None, str]]:
    """Every backend's (available, reason) for diagnostics (`dictation doctor`), in BACKEND_NAMES order.

    What `choice` already asked is reused; the backends it did not try (one came first, or the settings
    named another) are asked now; those this kind of session rules out are (None, why), unasked.
    """
    factories = default_factories() if factories is None else factories
    _, excluded = candidate_order(choice.environment)
    result: dict[str, tuple[bool | None, str]] = {}
    for name in BACKEND_NAMES:
        if name in choice.probed:
            result[name] = choice.probed[name]
        elif name in excluded:
            result[name] = (None, excluded[name])
        else:
            result[name] = factories[name]().is_available()
    return result
