"""`dictation doctor` and the settings window's Diagnostics page: what works here, what does not, the fix.

`run_checks(settings)` returns a flat list of `Check(area, name, status, detail, fix)`, grouped by
area in `AREAS` order: the session (display, tray, Qt's platform plugin and system libraries, the
start-at-login entry), the hotkey and text-output backends (through those packages' own choosers,
so the report says what the app itself would pick), the microphone, torch and the GPU, the model
folder and adapters, and the app's files. Status is "ok", "info" (nothing to do),
"warning" (works, but worse than it could) or "problem" (something the user wants does not work);
every warning and problem that has a remedy carries it in ``fix`` as the exact command or setting.

Qt-free (no Qt import) and safe to call from any thread. Nothing here loads a model, opens a
microphone stream, writes a file or touches the network (the Qt check dlopens Qt's platform plugin
and the system libraries of `dictation.system_packages`, as the app itself loads them); a run takes
well under a second, plus the import of torch when its build has CUDA (a CPU-only build is
recognised from torch/version.py without importing it). An exception inside an area becomes one
"problem" Check naming it: a run never raises.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import platform as platform_module
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dictation import __version__, spawn, system_packages
from dictation.config.settings import Settings

STATUSES = ("ok", "info", "warning", "problem")
AREAS = ("Session", "Hotkeys", "Output", "Microphone", "Engine", "Model", "Files")
MARKS = {"ok": "✔", "info": "·", "warning": "!", "problem": "✘"}
ASCII_MARKS = {"ok": "+", "info": "-", "warning": "!", "problem": "x"}

COMMANDS_SECTION = "README: 'Driving it from the command line (Wayland compositors)'"
BIND_COMMANDS_FIX = (
    "bind `dictation toggle` (or `dictation start` on press and `dictation stop` on release) to a key "
    f"in your desktop or compositor; see {COMMANDS_SECTION}"
)
NO_MODEL_FIX = "download one on the Model page, or run `dictation download Qwen/Qwen3-ASR-0.6B` and choose it there"
CUDA_TORCH_FIX = (
    "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu128 "
    "(or the CUDA version your driver supports: https://pytorch.org/get-started/locally/)"
)
CPU_TORCH_URL = "https://download.pytorch.org/whl/cpu"
YDOTOOLD_FIX = (
    "start the ydotool daemon: `systemctl --user enable --now ydotool` where the package ships that "
    "service, else add `ydotoold &` to your session's startup (it needs write access to /dev/uinput)"
)
SOUND_SERVER_FIX = (
    "start the sound server: `systemctl --user start pipewire pipewire-pulse wireplumber` (or `pulseaudio --start`)"
)
NVIDIA_PROC = "/proc/driver/nvidia"
LOW_DISK_BYTES = 5 * 10**9  # the 1.7B model is 4.7 GB
SMI_TIMEOUT_S = 2.0
DBUS_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Check:
    """One finding. ``status``: "ok", "info", "warning" or "problem"; ``fix``: what to do, or None."""

    area: str
    name: str
    status: str
    detail: str
    fix: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown check status {self.status!r}; known: {', '.join(STATUSES)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Context:
    """What the checks look at: the settings, the environment variables and the platform."""

    settings: Settings
    env: Mapping[str, str]
    platform: str
    settings_notes: tuple[str, ...] = ()  # problems found in settings.json (read-only load)
    settings_file: Path | None = None

    def which(self, tool: str) -> str | None:
        return shutil.which(tool, path=self.env.get("PATH", os.defpath))

    @property
    def linux(self) -> bool:
        return self.platform.startswith("linux")

    @property
    def package_manager(self) -> str:
        return system_packages.package_manager(self.which)

    def install(self, *tools: str) -> str:
        """`sudo apt install wtype wl-clipboard`, for this system's package manager (apt if none is
        found): the packages of `dictation.system_packages` that provide ``tools`` (commands or
        package names), else the names themselves."""
        manager = self.package_manager
        packages: list[str] = []
        for tool in tools:
            listed = system_packages.for_tool(tool)
            package = (listed.name(manager) if listed else None) or tool
            if package not in packages:
                packages.append(package)
        return f"`{system_packages.INSTALL[manager]} {' '.join(packages)}`"


# --- running and reporting ------------------------------------------------------------------------


def run_checks(
    settings: Settings | None = None,
    *,
    env: Mapping[str, str] | None = None,
    platform: str | None = None,
    areas: Iterable[str] = AREAS,
) -> list[Check]:
    """Every check of ``areas`` (default: all), in area order. Never raises.

    ``settings``: None reads settings.json without changing it (the app repairs it when it starts).
    ``env`` and ``platform`` default to os.environ and sys.platform.
    """
    env = dict(os.environ if env is None else env)
    platform = sys.platform if platform is None else platform
    try:
        stored, notes, path = load_settings_readonly()
    except Exception as exc:  # noqa: BLE001 - reported below, a run never fails
        stored, notes, path = Settings(), (f"cannot read the settings: {type(exc).__name__}: {exc}",), None
    ctx = Context(settings if settings is not None else stored, env, platform, notes, path)
    checks: list[Check] = []
    for area in areas:
        function = _AREA_CHECKS[area]
        try:
            checks += function(ctx)
        except Exception as exc:  # noqa: BLE001 - a broken check is itself the finding
            checks.append(
                Check(
                    area,
                    f"{area} checks",
                    "problem",
                    f"the {area.lower()} checks failed: {type(exc).__name__}: {exc}",
                    "please report this with the output of `dictation doctor --json`",
                )
            )
    return checks


def has_problems(checks: Iterable[Check]) -> bool:
    return any(c.status == "problem" for c in checks)


def summary(checks: list[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in ("problem", "warning")}
    if not any(counts.values()):
        return "No problems found."
    parts = [f"{n} {s}{'' if n == 1 else 's'}" for s, n in counts.items() if n]
    return ", ".join(parts) + "."


def format_report(checks: list[Check], *, ascii_only: bool = False) -> str:
    """The readable report: checks grouped by area with ✔ / · / ! / ✘ marks and their fixes."""
    marks = ASCII_MARKS if ascii_only else MARKS
    order = [a for a in AREAS if any(c.area == a for c in checks)]
    order += [a for a in dict.fromkeys(c.area for c in checks) if a not in order]
    lines = [f"dictation {__version__}: diagnostics"]
    for area in order:
        lines += ["", area]
        for check in (c for c in checks if c.area == area):
            detail = check.detail.replace("\n", "\n      ")
            lines.append(f"  {marks[check.status]} {check.name}: {detail}")
            if check.fix:
                lines.append(f"      fix: {check.fix}")
    lines += ["", summary(checks)]
    return "\n".join(lines)


def report_dict(checks: list[Check]) -> dict[str, Any]:
    return {
        "version": __version__,
        "problems": sum(c.status == "problem" for c in checks),
        "warnings": sum(c.status == "warning" for c in checks),
        "areas": [a for a in AREAS if any(c.area == a for c in checks)],
        "checks": [c.to_dict() for c in checks],
    }


def main(as_json: bool = False) -> int:
    """`dictation doctor [--json]`: print the report; 1 if any check found a problem, else 0."""
    checks = run_checks()
    if as_json:
        print(json.dumps(report_dict(checks), ensure_ascii=False, indent=2))
    else:
        encoding = getattr(sys.stdout, "encoding", None) or "ascii"
        try:
            "".join(MARKS.values()).encode(encoding)
            ascii_only = False
        except (UnicodeEncodeError, LookupError):
            ascii_only = True
        print(format_report(checks, ascii_only=ascii_only))
    return 1 if has_problems(checks) else 0


def load_settings_readonly(path: Path | None = None) -> tuple[Settings, tuple[str, ...], Path]:
    """The settings in settings.json and what is wrong in the file, without writing anything.

    (SettingsStore.load repairs and rewrites a bad file; a diagnosis must not.)
    """
    from dictation.config.migrations import migrate
    from dictation.config.schema import from_dict
    from dictation.config.settings import SCHEMA_VERSION
    from dictation.config.store import VERSION_KEY, default_path

    path = default_path() if path is None else path
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Settings(), (), path
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Settings(), (f"not valid JSON ({exc})",), path
    if not isinstance(data, dict):
        return Settings(), ("not a JSON object",), path
    version = data.pop(VERSION_KEY, 0)
    if isinstance(version, int) and not isinstance(version, bool) and 0 <= version < SCHEMA_VERSION:
        data = migrate(data, version, SCHEMA_VERSION)
    settings, problems = from_dict(Settings, data)
    return settings, tuple(str(p) for p in problems), path


# --- Session --------------------------------------------------------------------------------------


def _session(ctx: Context) -> list[Check]:
    from dictation.output.environment import detect_session

    area = "Session"
    python = sys.version.split()[0]
    checks = [
        Check(
            area,
            "Platform",
            "info",
            f"{platform_module.system()} {platform_module.release()}, Python {python}, dictation {__version__}",
        )
    ]
    session = detect_session(ctx.env, ctx.platform)
    variables = ", ".join(
        f"{k}={ctx.env.get(k) or '(unset)'}" for k in ("XDG_SESSION_TYPE", "WAYLAND_DISPLAY", "DISPLAY")
    )
    inside = "start dictation from inside your desktop session (a terminal there, the app menu or autostart)"
    if session.kind == "wayland" and not session.wayland_display:
        checks.append(
            Check(
                area,
                "Display server",
                "warning",
                f"Wayland by XDG_SESSION_TYPE, but WAYLAND_DISPLAY is unset, so apps can't reach the compositor "
                f"({variables})",
                f"{inside}, where WAYLAND_DISPLAY is set",
            )
        )
    elif session.kind in ("wayland", "x11"):
        label = "Wayland" if session.kind == "wayland" else "X11"
        checks.append(Check(area, "Display server", "ok", f"{label} ({variables})"))
    elif session.kind in ("windows", "macos"):
        checks.append(Check(area, "Display server", "ok", "Windows" if session.kind == "windows" else "macOS"))
    else:
        checks.append(
            Check(
                area,
                "Display server",
                "problem",
                f"no graphical session: neither DISPLAY nor WAYLAND_DISPLAY is set ({variables})",
                f"{inside}, where DISPLAY or WAYLAND_DISPLAY is set",
            )
        )
    if session.is_linux:
        raw = ctx.env.get("XDG_CURRENT_DESKTOP", "")
        shown = raw or "XDG_CURRENT_DESKTOP is unset"
        if session.desktop and session.desktop.lower() != raw.lower():
            shown += f" (read as {session.desktop})"
        checks.append(Check(area, "Desktop", "info", shown))
    owner = None
    if session.is_linux and session.kind != "none":
        owner = bus_name_has_owner("org.kde.StatusNotifierWatcher", ctx.env)
    checks.append(tray_check(owner, ctx.env, ctx.platform))
    checks += qt_checks(ctx)
    checks.append(autostart_check(ctx))
    return checks


def qt_checks(ctx: Context) -> list[Check]:
    """Whether Qt's platform plugin loads here (the display aside: the row above covers it), through
    `dictation.preflight` as the app checks it at start, and whether every system library of Qt's
    rows in `dictation.system_packages` is installed; each problem with its install command."""
    from dictation import preflight

    area, name = "Session", "Qt"
    if not ctx.linux:
        return []
    root = preflight.default_plugins_root()
    if not preflight.plugin_folders(ctx.env, root):
        detail = "Qt's plugin folder was not found (PySide6 is not installed from its wheel): not checked here"
        return [Check(area, name, "info", detail + "; the app checks its platform plugin when it starts")]
    load_library = system_packages.load_library
    attempts = preflight.try_platforms(ctx.env, root, preflight.load_plugin, check_display=False)
    detail, fix = preflight.failure(attempts, ctx.env, load_library)
    if detail:
        return [Check(area, name, "problem", detail, fix)]
    missing = system_packages.missing_libraries(system_packages.libraries("qt"), load_library)
    if missing:
        detail = "system libraries Qt needs are missing: " + "; ".join(missing.values())
        return [Check(area, name, "problem", detail, system_packages.fix_for_libraries(missing, ctx.package_manager))]
    used = attempts[-1]
    version = _pyside_version()
    if used.plugin:
        where = f'the "{used.platform}" platform plugin loads ({used.plugin})'
    else:
        where = f'no file for the "{used.platform}" platform plugin in Qt\'s plugin folders: not checked'

    checks = [Check(area, name, "ok" if used.plugin else "info", f"{version}{where}")]
    if len(attempts) > 1:  # Qt's first choice (Wayland) cannot load: it falls back to XWayland
        first = attempts[0]
        fix = preflight.library_fix([first.load_error], ["qt-wayland"], load_library, ctx.which)
        checks.append(
            Check(
                area,
                "Qt on Wayland",
                "warning",
                f'the "{first.platform}" platform plugin cannot load ({first.load_error}): windows go through '
                "XWayland instead",
                fix,
            )
        )
    return checks


def _pyside_version() -> str:
    from importlib import metadata

    for dist in ("PySide6-Essentials", "PySide6"):
        try:
            return f"PySide6 {metadata.version(dist)}: "
        except metadata.PackageNotFoundError:
            continue
    return ""


def autostart_check(ctx: Context) -> Check:
    """The "Start at login" entry: there when the setting is on, and its command's program exists."""
    from dictation import autostart

    area, name = "Session", "Start at login"
    on = ctx.settings.general.start_at_login
    entry = autostart.read_entry(ctx.platform)
    if entry is None:
        path = autostart.autostart_path(ctx.platform)
        if not on:
            return Check(area, name, "info", "off")
        return Check(
            area,
            name,
            "problem",
            f"on in the settings, but {path} does not exist, so the app does not start at login",
            "start Dictation once: while the setting is on, it writes the entry at every start",
        )
    whose = "" if entry.ours else " (your own entry)"
    if not entry.enabled:
        detail = f"{entry.path}{whose} is switched off in the desktop's startup settings"
        return Check(area, name, "warning" if on else "info", detail, "switch it on there" if on else None)
    if entry.command is None:
        return Check(area, name, "warning", f"{entry.path}{whose}: its command cannot be read", f"delete {entry.path}")
    why = autostart.missing_program(entry.command, ctx.env)
    if why:
        if not entry.ours:
            fix = f"edit or delete {entry.path}"
        elif on:
            fix = "start Dictation from the installation you use: it rewrites the entry at every start"
        else:
            fix = f"turn Start at login on and off again in the settings, or delete {entry.path}"
        detail = f"{entry.path}{whose} starts a program that is gone: {why} (a moved or deleted virtual environment?)"
        return Check(area, name, "problem", detail, fix)
    command = " ".join(entry.command)
    return Check(area, name, "ok", f"{entry.path}{whose} starts {command}")


def tray_check(available: bool | None, env: Mapping[str, str], platform: str, *, live: bool = False) -> Check:
    """The system tray row. ``available``: a StatusNotifier host runs (None: no session bus to ask), or
    with ``live`` what Qt's QSystemTrayIcon.isSystemTrayAvailable() says."""
    from dictation.output.environment import detect_session

    session = detect_session(env, platform)
    name = "System tray"
    if session.kind in ("windows", "macos") and not live:
        return Check("Session", name, "ok", "the system tray (menu bar) is always there")
    if available:
        how = "Qt reports a system tray" if live else "a StatusNotifier host runs (org.kde.StatusNotifierWatcher)"
        return Check("Session", name, "ok", how)
    if session.kind == "none":
        return Check("Session", name, "info", "no graphical session, so no tray")
    if session.kind == "x11" and not live:
        why = "no D-Bus session bus" if available is None else "no StatusNotifier host on the session bus"
        return Check(
            "Session",
            name,
            "info",
            f"{why}; an X11 panel tray (XEmbed) may still show the icon (the Diagnostics page in the settings "
            "window checks for real)",
        )
    if available is None and not live:
        detail = "no D-Bus session bus, so no StatusNotifier tray"
    else:
        detail = "no system tray found"
    detail += ": the app shows a small status window with the same menu instead"
    desktop = (session.desktop or "").lower()
    if desktop == "gnome":
        extension = Context(Settings(), env, platform).install("gnome-shell-extension-appindicator")
        fix = (
            f"install and enable the AppIndicator extension: {extension}, then turn it on "
            "in the Extensions app and log out and back in"
        )
    elif desktop == "kde":
        fix = "add the System Tray widget to a panel"
    else:
        fix = "add a StatusNotifier tray to your panel or bar (waybar: the `tray` module)"
    return Check("Session", name, "warning", detail, fix)


def bus_name_has_owner(name: str, env: Mapping[str, str] | None = None) -> bool | None:
    """Whether ``name`` has an owner on the session bus; None when there is no session bus to ask."""
    from dictation.hotkeys.portal import session_bus_address

    address = session_bus_address(env)
    if not address:
        return None
    try:
        from jeepney.bus_messages import message_bus
        from jeepney.io.blocking import open_dbus_connection
        from jeepney.wrappers import unwrap_msg
    except ImportError:
        return None
    try:
        conn = open_dbus_connection(bus=address, auth_timeout=DBUS_TIMEOUT_S)
    except (OSError, RuntimeError, ValueError, TimeoutError):
        return None
    try:
        reply = conn.send_and_get_reply(message_bus.NameHasOwner(name), timeout=DBUS_TIMEOUT_S)
        return bool(unwrap_msg(reply)[0])
    except Exception:  # noqa: BLE001 - a bus that misbehaves counts as no bus
        return None
    finally:
        conn.close()


# --- Hotkeys --------------------------------------------------------------------------------------


def hotkey_factories() -> dict[str, Callable[[], Any]]:
    """The hotkey backends as the app builds them, with a short portal timeout (a diagnosis must be quick)."""
    from dictation.hotkeys.choose import default_factories
    from dictation.hotkeys.portal import PortalBackend

    return {**default_factories(), "portal": lambda: PortalBackend(call_timeout=DBUS_TIMEOUT_S)}


def _hotkeys(ctx: Context) -> list[Check]:
    from dictation.hotkeys.choose import Environment, backend_availability, choose_backend

    area = "Hotkeys"
    environment = Environment.detect(ctx.env, ctx.platform)
    factories = hotkey_factories()
    preference = ctx.settings.hotkeys.backend
    choice = choose_backend(preference, environment=environment, factories=factories)
    availability = backend_availability(choice, factories)
    active = choice.backend.name if choice.backend is not None else None
    fixes = {name: _hotkey_fix(name, reason, ctx) for name, (ok, reason) in availability.items() if not ok}
    hotkey = ctx.settings.hotkeys.hotkey

    if active is not None:
        how = "chosen in settings" if preference != "auto" else "picked automatically"
        summary_check = Check(
            area,
            "Active backend",
            "ok",
            f"{active} ({how}; {environment.label}) for {hotkey}: {availability[active][1]}",
        )
    elif preference == "none":
        summary_check = Check(
            area, "Active backend", "info", "none: global hotkeys are off in the settings", BIND_COMMANDS_FIX
        )
    elif preference != "auto":
        reason = availability.get(preference, (False, "unknown"))[1]
        fix = fixes.get(preference)
        other = "set Hotkey backend to Automatic on the General page"
        summary_check = Check(
            area,
            "Active backend",
            "problem",
            f"none: {preference} is chosen in the settings but can't be used here: {reason}",
            f"{fix}; or {other}" if fix else other,
        )
    else:
        specific = [fixes[n] for n in availability if fixes.get(n)]
        summary_check = Check(
            area,
            "Active backend",
            "problem",
            f"none: no global hotkey backend works in this {environment.label}",
            "; or ".join([*specific, BIND_COMMANDS_FIX]),
        )
    checks = [summary_check]
    from dictation.hotkeys.x11_backend import X11GrabBackend

    if isinstance(choice.backend, X11GrabBackend):
        checks += _x11_grabs(ctx)
    for name, (ok, reason) in availability.items():
        if name == active:
            continue
        if ok is None:
            checks.append(Check(area, name, "info", f"not used here: {reason}"))
        elif ok:
            why = f"{active} comes first" if active and preference == "auto" else f"the settings choose {preference}"
            checks.append(Check(area, name, "info", f"available, not used ({why}): {reason}"))
        else:
            status = "info" if active is not None or preference == "none" else "warning"
            checks.append(Check(area, name, status, f"unavailable: {reason}", fixes.get(name)))
    return checks


def x11_grab_probe(hotkeys: list[str], display: str | None) -> dict[str, str | None]:
    """hotkey -> why it can't be grabbed on ``display`` (None: it can). Replaced in tests."""
    from dictation.hotkeys.x11_backend import probe_grabs

    return probe_grabs(hotkeys, display)


def running_app_status() -> dict | None:
    """The running app's `dictation status` reply, or None when it does not run. Replaced in tests."""
    from dictation.ipc import IpcError, send_command

    try:
        return send_command("status", timeout=DBUS_TIMEOUT_S)
    except IpcError:
        return None


def _x11_grabs(ctx: Context) -> list[Check]:
    """Can the x11 backend grab the hotkey and the cancel key, or does another program hold them?"""
    area = "Hotkeys"
    h = ctx.settings.hotkeys
    keys = [k for k in (h.hotkey, h.cancel_key) if k]
    try:
        results = x11_grab_probe(keys, ctx.env.get("DISPLAY"))
    except Exception as exc:  # noqa: BLE001 - a display that misbehaves: say so, the rest still runs
        return [Check(area, "Key grabs", "warning", f"could not try the key grabs: {type(exc).__name__}: {exc}")]
    app: dict | None = None
    checks = []
    for key in keys:
        what = "hotkey" if key == h.hotkey else "cancel key"
        problem = results.get(key)
        if problem is None:
            checks.append(Check(area, f"Grab {key}", "ok", f"free: the app takes the {what} from other programs"))
            continue
        if "already taken" in problem and key == h.hotkey:
            app = app if app is not None else (running_app_status() or {})
            if app.get("hotkeys") == "x11" and not app.get("hotkey_problems"):
                checks.append(Check(area, f"Grab {key}", "ok", "held by the running dictation app"))
                continue
        fix = "choose another key on the Recording page" + (
            ", or remove that shortcut from the program that holds it (window manager, xbindkeys, ...)"
            if "already taken" in problem
            else ""
        )
        checks.append(Check(area, f"Grab {key}", "problem", problem, fix))
    return checks


def _hotkey_fix(name: str, reason: str, ctx: Context) -> str | None:
    from dictation.hotkeys.evdev_backend import FIX_COMMAND

    if "'evdev' is not installed" in reason:
        return f"`pip install evdev` (it compiles: {ctx.install('gcc', 'python3-dev', 'linux-libc-dev')} first)"
    if name == "evdev" and FIX_COMMAND in reason:
        return f"`{FIX_COMMAND}`, then log out and back in"
    if name == "evdev" and "log out and back in" in reason:
        return "log out and back in (or reboot): a new group membership counts only in a new login session"
    if "'jeepney' is not installed" in reason:
        return "`pip install jeepney`"
    if name == "portal" and "is not running on the session bus" in reason:
        from dictation.output.environment import detect_desktop

        desktop = detect_desktop(ctx.env) or ""
        backend = {"gnome": "gnome", "kde": "kde", "hyprland": "hyprland"}.get(desktop)
        if backend is None:
            return (
                f"{ctx.install('xdg-desktop-portal')} and the portal backend of your desktop (-kde, -gnome or "
                "-hyprland offer global shortcuts), then log out and back in"
            )
        return f"{ctx.install('xdg-desktop-portal', 'xdg-desktop-portal-' + backend)}, then log out and back in"
    if name == "pynput" and "'pynput' is not installed" in reason:
        return "`pip install pynput`"
    if name == "x11" and "'python-xlib' is not installed" in reason:
        return "`pip install python-xlib`"
    return None


# --- Output ---------------------------------------------------------------------------------------

# Tools per session kind: (row name, tools that must all be found, what it is for).
_OUTPUT_TOOLS = {
    "x11": (
        ("xdotool", ("xdotool",), "sends the paste keys and types"),
        ("xclip", ("xclip",), "clipboard, keeps images too"),
        ("xsel", ("xsel",), "clipboard, text only; used without xclip"),
        ("xmodmap", ("xmodmap",), "lets xdotool type non-ASCII text reliably"),
    ),
    "wayland": (
        ("wtype", ("wtype",), "sends keys on wlroots compositors (Sway, Hyprland, river, ...)"),
        ("ydotool", ("ydotool",), "sends keys on any compositor, through its daemon ydotoold"),
        ("wl-clipboard", ("wl-copy", "wl-paste"), "the Wayland clipboard"),
    ),
}


def _output(ctx: Context) -> list[Check]:
    from dictation.output.environment import NO_VIRTUAL_KEYBOARD_DESKTOPS, detect_session
    from dictation.output.keys import YdotoolKeys
    from dictation.output.process import SystemHost
    from dictation.output.select import choose_backend, plan_backends

    area = "Output"
    session = detect_session(ctx.env, ctx.platform)
    host = SystemHost(ctx.env)
    options = ctx.settings.output
    checks: list[Check] = []
    delivering = False
    try:
        names, _forced = plan_backends(session.kind, options.backend, options.method)
    except ValueError as exc:
        checks.append(
            Check(
                area,
                "Text delivery",
                "problem",
                str(exc),
                "set Output tool to Automatic (or wtype, ydotool, xdotool, pynput) on the Output page",
            )
        )
    else:
        chain = choose_backend(options, ctx.env, platform=ctx.platform, host=host)
        statuses = chain.statuses()
        members = statuses[: len(chain.backends)]
        active = next((s for s in members if s.ok), None)
        order = ", ".join(names) + (", then the clipboard" if chain.fallback is not None else "")
        if names == ("clipboard",):
            delivering = True
            checks.append(
                Check(area, "Text delivery", "info", "clipboard only (chosen in settings): you paste the text yourself")
            )
        elif active is not None:
            delivering = True
            note = "" if active.unicode != "no" else "; it cannot type non-ASCII text"
            checks.append(Check(area, "Text delivery", "ok", f"{active.name}: {active.reason}{note} (order: {order})"))
        else:
            reasons = "; ".join(f"{s.name}: {s.reason}" for s in members)
            clipboard = statuses[-1] if chain.fallback is not None else None
            if clipboard is not None and clipboard.ok:
                detail = f"no tool can send keys here, so the text is only put on the clipboard ({reasons})"
            else:
                detail = f"the text can't be delivered at all ({reasons})"
            checks.append(Check(area, "Text delivery", "problem", detail, _output_fix(ctx, session)))

    for row, tools, purpose in _OUTPUT_TOOLS.get(session.kind, ()):
        paths = [ctx.which(t) for t in tools]
        unusable = row == "wtype" and session.desktop in NO_VIRTUAL_KEYBOARD_DESKTOPS
        if all(paths):
            if unusable:
                detail = (
                    f"{paths[0]}, but {session.desktop} has no virtual-keyboard protocol: wtype can't send keys there"
                )
                checks.append(Check(area, row, "info", detail))
            else:
                checks.append(Check(area, row, "ok", f"{', '.join(p for p in paths if p)}: {purpose}"))
            if row == "ydotool":
                sockets = YdotoolKeys(host, session).socket_candidates()
                running = next((s for s in sockets if host.exists(s)), None)
                if running:
                    checks.append(Check(area, "ydotoold", "ok", f"running (socket {running})"))
                else:
                    status = "info" if delivering else "warning"
                    detail = f"not running (no socket at {' or '.join(sockets)})"
                    checks.append(Check(area, "ydotoold", status, detail, YDOTOOLD_FIX))
            continue
        missing = [t for t, p in zip(tools, paths, strict=True) if not p]
        if unusable:
            checks.append(Check(area, row, "info", f"not installed (it would not work on {session.desktop} anyway)"))
        elif row == "xsel" and ctx.which("xclip"):
            checks.append(Check(area, row, "info", f"not installed (not needed: xclip is there); {purpose}"))
        else:
            status = "info" if delivering else "warning"
            checks.append(Check(area, row, status, f"not installed ({purpose})", ctx.install(*missing)))
    return checks


def _output_fix(ctx: Context, session: Any) -> str | None:
    from dictation.output.environment import NO_VIRTUAL_KEYBOARD_DESKTOPS

    if session.kind == "x11":
        wanted = ["xdotool"] + ([] if ctx.which("xclip") or ctx.which("xsel") else ["xclip"])
        missing = [t for t in wanted if not ctx.which(t)]
        return ctx.install(*missing) if missing else None
    if session.kind == "wayland":
        ydotool = session.desktop in NO_VIRTUAL_KEYBOARD_DESKTOPS
        wanted = ["ydotool" if ydotool else "wtype", "wl-copy"]
        missing = [t for t in wanted if not ctx.which(t)]
        steps = [ctx.install(*missing)] if missing else []
        if ydotool:
            steps.append(YDOTOOLD_FIX)
        return ", then ".join(steps) if steps else None
    if session.kind == "macos":
        return (
            "allow the app that runs dictation under System Settings → Privacy & Security → Accessibility "
            "(and `pip install pynput` if it is missing)"
        )
    if session.kind == "windows":
        return "`pip install pynput`"
    return "start dictation from inside your desktop session"


# --- Microphone -----------------------------------------------------------------------------------


def _microphone(ctx: Context) -> list[Check]:
    from dictation.audio import devices as audio

    area = "Microphone"
    try:
        sd = audio.import_sounddevice()
    except audio.AudioDeviceError as exc:
        text = str(exc)
        if "PortAudio library not found" in text:
            fix = f"{ctx.install('portaudio')}, then start dictation again"
        elif "sounddevice package is not installed" in text:
            fix = "`pip install sounddevice`"
        else:
            fix = None
        return [Check(area, "Audio library", "problem", text, fix)]
    try:
        portaudio = sd.get_portaudio_version()[1].split(", revision")[0]
    except Exception:  # noqa: BLE001 - only for the detail line
        portaudio = "PortAudio"
    checks = [Check(area, "Audio library", "ok", f"sounddevice {getattr(sd, '__version__', '?')}, {portaudio}")]
    try:
        devices = audio.list_input_devices()
    except audio.AudioDeviceError as exc:
        devices, error = [], str(exc)
    else:
        error = ""
    server = _sound_server(ctx)
    if server is not None:
        found, detail = server
        if found:
            checks.append(Check(area, "Sound server", "ok", detail))
        else:
            checks.append(Check(area, "Sound server", "info" if devices else "warning", detail, SOUND_SERVER_FIX))
    if not devices:
        detail = error or "no microphone found: the audio system lists no input devices"
        checks.append(Check(area, "Microphones", "problem", detail, _microphone_fix(ctx)))
        return checks
    names = ", ".join(f"[{d.index}] {d.name}{' (default)' if d.is_default else ''}" for d in devices[:8])
    more = f" and {len(devices) - 8} more" if len(devices) > 8 else ""
    count = "1 input device" if len(devices) == 1 else f"{len(devices)} input devices"
    checks.append(Check(area, "Microphones", "ok", f"{count}: {names}{more}"))
    spec = ctx.settings.recording.input_device.strip()
    spec = "" if spec == "default" else spec  # as the controller reads it
    try:
        device = audio.find_input_device(spec or None, devices)
    except audio.AudioDeviceError as exc:
        checks.append(
            Check(
                area,
                "Selected microphone",
                "problem",
                str(exc),
                "plug it in, or choose another microphone on the Recording page (`dictation devices` lists them)",
            )
        )
    else:
        which = f"{spec!r}" if spec else "the system default"
        default = "" if spec or device.is_default else " (PortAudio reports no default input: the first one is used)"
        checks.append(
            Check(
                area,
                "Selected microphone",
                "ok",
                f"{which}: [{device.index}] {device.name}, {device.default_samplerate} Hz{default}",
            )
        )
    return checks


def _sound_server(ctx: Context) -> tuple[bool, str] | None:
    """(found, detail) for PipeWire / PulseAudio on Linux; None elsewhere."""
    if not ctx.linux:
        return None
    if ctx.env.get("PULSE_SERVER"):
        return True, f"PulseAudio server {ctx.env['PULSE_SERVER']} (PULSE_SERVER)"
    runtime = ctx.env.get("XDG_RUNTIME_DIR")
    if not runtime:
        return False, "XDG_RUNTIME_DIR is unset, so no PipeWire or PulseAudio server can be found"
    found = [
        name
        for name, sub in (("PipeWire", "pipewire-0"), ("PulseAudio", "pulse/native"))
        if (Path(runtime) / sub).exists()
    ]
    if found:
        return True, f"{' with '.join(found)} socket in {runtime}"
    return False, f"no PipeWire or PulseAudio socket in {runtime}: only ALSA devices can be used"


def _microphone_fix(ctx: Context) -> str:
    if ctx.platform == "darwin":
        return (
            "allow microphone access for the app that runs dictation: System Settings → Privacy & Security → Microphone"
        )
    if ctx.platform.startswith("win"):
        return "Settings → Privacy & security → Microphone: turn on access for desktop apps, and plug a microphone in"
    return (
        "plug a microphone in and check that the sound server sees it (`pactl list short sources`, or "
        f"`arecord -l` for ALSA); if it doesn't, {SOUND_SERVER_FIX}; in a Flatpak or Snap, allow microphone access"
    )


# --- Engine ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TorchBuild:
    version: str
    cuda: str | None = None
    hip: str | None = None


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    total_bytes: int | None = None
    free_bytes: int | None = None


def torch_build() -> TorchBuild | None:
    """The installed torch's version and GPU build, without importing torch if it isn't yet (slow)."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "version"):
        return TorchBuild(str(torch.__version__), torch.version.cuda, getattr(torch.version, "hip", None))
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    values: dict[str, Any] = {}
    for node in ast.parse((Path(spec.origin).parent / "version.py").read_text(encoding="utf-8")).body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    return TorchBuild(str(values.get("__version__", "?")), values.get("cuda"), values.get("hip"))


def nvidia_driver_present(env: Mapping[str, str]) -> str | None:
    """What shows an NVIDIA driver here (nvidia-smi on PATH, /proc/driver/nvidia), or None."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    if smi:
        return f"{smi} is installed"
    if os.path.exists(NVIDIA_PROC):
        return f"{NVIDIA_PROC} exists"
    return None


def cuda_devices(env: Mapping[str, str]) -> tuple[bool, str, list[GpuInfo]]:
    """(usable, why not, GPUs) as torch sees them. Imports torch; creates no CUDA context."""
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        usable = torch.cuda.is_available()
    if not usable:
        return False, "; ".join(str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()), []
    initialized = torch.cuda.is_initialized()
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        free = torch.cuda.mem_get_info(i)[0] if initialized else None
        gpus.append(GpuInfo(i, props.name, int(props.total_memory), free))
    if not initialized:  # free memory without creating a context: ask nvidia-smi, where it matches
        smi = _smi_memory(env)
        if len(smi) == len(gpus) and all(s.name == g.name for s, g in zip(smi, gpus, strict=True)):
            gpus = [dataclasses.replace(g, free_bytes=s.free_bytes) for s, g in zip(smi, gpus, strict=True)]
    return True, "", gpus


def _smi_memory(env: Mapping[str, str]) -> list[GpuInfo]:
    smi = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    if not smi or env.get("CUDA_VISIBLE_DEVICES"):
        return []
    try:
        proc = spawn.run(
            [smi, "--query-gpu=index,name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            env=env,
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        try:
            gpus.append(GpuInfo(int(parts[0]), parts[1], int(parts[2]) * 2**20, int(parts[3]) * 2**20))
        except (ValueError, IndexError):
            return []
    return gpus


def mps_available() -> bool:
    import torch

    return bool(torch.backends.mps.is_available())


def _gb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e9:.1f} GB"


def _engine(ctx: Context) -> list[Check]:
    area = "Engine"
    build = torch_build()
    if build is None:
        return [
            Check(
                area,
                "PyTorch",
                "problem",
                "PyTorch is not installed",
                "`pip install torch` (CPU only: add `--index-url https://download.pytorch.org/whl/cpu`)",
            )
        ]
    kind = f"CUDA {build.cuda} build" if build.cuda else f"ROCm {build.hip} build" if build.hip else "CPU-only build"
    checks = [Check(area, "PyTorch", "ok", f"torch {build.version}, {kind}")]
    driver = nvidia_driver_present(ctx.env)
    gpus: list[GpuInfo] = []
    accelerator = "cpu"
    cores = os.cpu_count() or "?"
    if ctx.platform == "darwin":
        if mps_available():
            accelerator = "mps"
            checks.append(Check(area, "GPU", "ok", "Apple GPU (MPS) available"))
        else:
            checks.append(
                Check(area, "GPU", "info", f"MPS is not available: the model runs on the CPU ({cores} cores)")
            )
    elif build.cuda or build.hip:
        usable, why, gpus = cuda_devices(ctx.env)
        if usable:
            accelerator = "cuda"
            rows = [f"cuda:{g.index} {g.name}, {_gb(g.total_bytes)} total, {_gb(g.free_bytes)} free" for g in gpus]
            checks.append(Check(area, "GPU", "ok", "\n".join(rows)))
        elif driver:
            detail = f"torch is built for {'CUDA ' + build.cuda if build.cuda else 'ROCm ' + str(build.hip)}, "
            detail += f"but can't use the GPU ({driver}){': ' + why if why else ''}; the model runs on the CPU"
            fix = (
                f"update the NVIDIA driver to one that supports CUDA {build.cuda} (`nvidia-smi` shows the newest "
                "CUDA version the driver supports), or install a torch build for your driver: "
                "https://pytorch.org/get-started/locally/"
            )
            checks.append(Check(area, "GPU", "warning", detail, fix))
        elif build.cuda:
            checks.append(
                Check(
                    area,
                    "GPU",
                    "warning",
                    f"torch {build.version} is a CUDA {build.cuda} build, but this machine shows no NVIDIA GPU "
                    f"(no nvidia-smi{', no ' + NVIDIA_PROC if ctx.linux else ''}): the model runs on the CPU "
                    f"({cores} cores) and the CUDA libraries only take up disk space; the CPU build is as fast "
                    "here and several GB smaller",
                    cpu_torch_fix(ctx.linux),
                )
            )
        else:
            checks.append(Check(area, "GPU", "info", f"no NVIDIA GPU found: the model runs on the CPU ({cores} cores)"))
    elif driver:
        checks.append(
            Check(
                area,
                "GPU",
                "warning",
                f"this machine has an NVIDIA GPU ({driver}), but torch {build.version} is a CPU-only build: "
                "the model runs on the CPU, several times slower",
                CUDA_TORCH_FIX,
            )
        )
    else:
        checks.append(
            Check(
                area,
                "GPU",
                "info",
                f"CPU-only torch and no NVIDIA GPU found: the model runs on the CPU ({cores} cores)",
            )
        )
    checks.append(_device_check(ctx, accelerator, gpus))
    memory = _memory_check(ctx, gpus) if accelerator == "cuda" else None
    if memory is not None:
        checks.append(memory)
    return checks


def cpu_torch_fix(linux: bool, prefix: str | None = None) -> str:
    """How to swap a CUDA build of torch for the CPU build in the environment at ``prefix``
    (this one by default): through pipx where pipx made it, else pip.

    On Linux PyPI's CUDA build pulls in the nvidia-* and triton packages, which a
    ``--force-reinstall`` of the CPU build would leave behind, so they are removed too (the
    issue that asked for this measured 5.7 GB installed against 1.3 GB for the CPU build).
    """
    parts = Path(prefix if prefix is not None else sys.prefix).parts
    pip = "pipx runpip dictation" if "pipx" in parts or ".pipx" in parts else "pip"
    if linux:
        remove = f"{pip} uninstall -y torch triton $({pip} freeze | grep -o '^nvidia-[A-Za-z0-9_.-]*')"
        return f"`{remove}` then `{pip} install torch --index-url {CPU_TORCH_URL}` (about 1.3 GB instead of 5.7 GB)"
    return f"`{pip} uninstall -y torch` then `{pip} install torch --index-url {CPU_TORCH_URL}`"


def _device_check(ctx: Context, accelerator: str, gpus: list[GpuInfo]) -> Check:
    device = ctx.settings.engine.device
    fix = "set Device to Automatic or CPU on the Model page (or fix the GPU, see above)"
    if device == "auto":
        target = {"cuda": "cuda:0", "mps": "the Apple GPU (MPS)"}.get(accelerator, "the CPU")
        return Check("Engine", "Device", "info", f"Automatic: the model runs on {target}")
    if device.startswith("cuda"):
        if accelerator != "cuda":
            return Check(
                "Engine",
                "Device",
                "warning",
                f"set to {device}, but no CUDA GPU is usable: the app falls back to the CPU",
                fix,
            )
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= len(gpus):
            return Check(
                "Engine",
                "Device",
                "warning",
                f"set to {device}, but there are only {len(gpus)} GPU(s): the app falls back to the CPU",
                fix,
            )
    if device == "mps" and accelerator != "mps":
        return Check(
            "Engine", "Device", "warning", "set to mps, but MPS is not available: the app falls back to the CPU", fix
        )
    return Check("Engine", "Device", "ok", f"set to {device}")


def _memory_check(ctx: Context, gpus: list[GpuInfo]) -> Check | None:
    from dictation.asr.checkpoints.hub import find_known_model

    engine = ctx.settings.engine
    known = find_known_model(engine.model.strip())
    if known is None or not gpus or engine.variant in ("int8", "int4"):
        return None
    device = engine.device
    index = int(device.split(":")[1]) if device.startswith("cuda:") else 0
    gpu = next((g for g in gpus if g.index == index), gpus[0])
    if gpu.total_bytes is None or gpu.total_bytes >= known.vram_gb * 1e9:
        return None
    return Check(
        "Engine",
        "GPU memory",
        "warning",
        f"{known.label} needs about {known.vram_gb:g} GB of GPU memory in bf16; {gpu.name} has {_gb(gpu.total_bytes)}",
        "choose the int8 or int4 weights variant on the Model page, or the 0.6B model",
    )


# --- Model ----------------------------------------------------------------------------------------


def _model(ctx: Context) -> list[Check]:
    from dictation.asr.checkpoints.hub import (
        check_model_folder,
        hf_cache_dir,
        is_gguf_path,
        looks_like_repo_id,
        resolve_model,
    )
    from dictation.asr.tune.adapter_files import check_adapter

    area = "Model"
    engine = ctx.settings.engine
    spec = engine.model.strip()
    checks: list[Check] = []
    model_ok = False
    folder: Path | None = None
    if not spec:
        checks.append(Check(area, "Model", "problem", "no model chosen yet", NO_MODEL_FIX))
    else:
        error = check_model_folder(spec)
        if error is None:
            model_ok = True
            try:
                folder = resolve_model(spec)
            except Exception:  # noqa: BLE001 - a GGUF file path: resolve_model wants folders
                folder = Path(spec).expanduser()
            where = "" if str(folder) == spec else f" ({folder})"
            checks.append(Check(area, "Model", "ok", f"{spec}{where}"))
        else:
            local = Path(spec).expanduser()
            if looks_like_repo_id(spec) and not local.exists():
                fix = f"`dictation download {spec}` (or download it on the Model page)"
            else:
                fix = "choose a complete model folder on the Model page (the folder that holds config.json)"
            checks.append(Check(area, "Model", "problem", error, fix))

    variant = f"weights {engine.variant}, precision {engine.dtype}, device {engine.device}"
    if folder is not None and folder.is_dir():
        config = folder / "config.json"
        if config.is_file() and "quantization_config" in config.read_text(encoding="utf-8", errors="replace"):
            variant += "; the folder is pre-quantized (its own variant applies)"
        elif not config.is_file() and is_gguf_path(folder):
            variant += "; GGUF weights"
    elif folder is not None and is_gguf_path(folder):
        variant += "; a GGUF file"
    checks.append(Check(area, "Variant", "info", variant))

    if not engine.adapters:
        checks.append(Check(area, "Adapters", "info", "none"))
    for i, adapter in enumerate(engine.adapters, 1):
        name = f"Adapter {i}"
        if not adapter.enabled:
            checks.append(Check(area, name, "info", f"{adapter.path} (turned off)"))
            continue
        error = check_adapter(adapter.path, spec if model_ok else None)
        if error is None:
            checks.append(Check(area, name, "ok", f"{adapter.path}, weight {adapter.weight:g}"))
        else:
            checks.append(
                Check(
                    area,
                    name,
                    "problem",
                    error,
                    "fix the folder, or turn the adapter off or remove it on the Model page",
                )
            )

    target = folder if folder is not None else hf_cache_dir()
    if spec and folder is None and not looks_like_repo_id(spec):
        target = Path(spec).expanduser()
    existing = _existing_ancestor(target)
    usage = shutil.disk_usage(existing)
    detail = f"{_gb(usage.free)} free of {_gb(usage.total)} on the disk holding {target}"
    if usage.free < LOW_DISK_BYTES:
        fix = (
            "free some space there (Qwen3-ASR-1.7B takes about 4.7 GB, the 0.6B 1.9 GB), or set HF_HOME to a "
            "folder on a larger disk before downloading"
        )
        checks.append(Check(area, "Disk space", "warning", detail, fix))
    else:
        checks.append(Check(area, "Disk space", "ok", detail))
    return checks


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


# --- Files ----------------------------------------------------------------------------------------


def _files(ctx: Context) -> list[Check]:
    from dictation.config.history import default_path as history_path
    from dictation.config.store import default_path as settings_path
    from dictation.paths import log_dir, recordings_dir

    area = "Files"
    checks: list[Check] = []
    for name, path in (
        ("Settings", ctx.settings_file or settings_path()),
        ("History", history_path()),
        ("Recordings", recordings_dir()),
        ("Log", log_dir() / "dictation.log"),
    ):
        exists = path.exists()
        where = path if exists else _existing_ancestor(path)
        writable = os.access(where, os.W_OK | (os.X_OK if where.is_dir() else 0))
        state = "" if exists else " (not created yet)"
        if writable:
            checks.append(Check(area, name, "ok", f"{path}{state}"))
            continue
        if where.is_relative_to(Path.home()) and where != Path.home():
            fix = f"`sudo chown -R $USER {where}`"
        else:
            fix = "set DICTATION_HOME to a folder you can write to"
        checks.append(Check(area, name, "problem", f"{path}{state}: {where} is not writable", fix))
    checks += _privacy(ctx)
    if ctx.settings_notes:
        checks.append(
            Check(
                area,
                "Settings file",
                "warning",
                "some values can't be used: " + "; ".join(ctx.settings_notes),
                "nothing to do by hand: the app resets them to their defaults when it starts (keeping a copy of the "
                "file); then set them again in the settings window",
            )
        )
    return checks


def _privacy(ctx: Context) -> list[Check]:
    """Whether other local users can read the history, recordings, settings or log (they should not)."""
    from dictation.paths import private_folders
    from dictation.private import exposed

    if ctx.platform.startswith("win"):
        return []
    folders = private_folders()
    found = exposed(folders)
    if not found:
        existing = [str(f) for f in folders if f.exists()]
        detail = "history, recordings, settings and log are readable by you alone"
        return [Check("Files", "Privacy", "ok", detail + (f" ({', '.join(existing)})" if existing else ""))]
    shown = ", ".join(f"{path} (mode {mode:o})" for path, mode in found[:3])
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    detail = f"{len(found)} of your private files and folders can be read by other users: {shown}{more}"
    targets = " ".join(str(f) for f in folders if f.exists())
    fix = f"start dictation once (it makes them private when it starts), or run `chmod -R go= {targets}`"
    return [Check("Files", "Privacy", "problem", detail, fix)]


_AREA_CHECKS: dict[str, Callable[[Context], list[Check]]] = {
    "Session": _session,
    "Hotkeys": _hotkeys,
    "Output": _output,
    "Microphone": _microphone,
    "Engine": _engine,
    "Model": _model,
    "Files": _files,
}
