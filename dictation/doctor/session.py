"""The Session area: the platform, the display server and desktop, the system tray, Qt's platform
plugin and system libraries, and the start-at-login entry."""

from __future__ import annotations

import platform as platform_module
import sys
from collections.abc import Mapping

from dictation import __version__, system_packages
from dictation.config.settings import Settings
from dictation.doctor.check import DBUS_TIMEOUT_S, Check, Context


def checks(ctx: Context) -> list[Check]:
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
        fix = _tray_fix(session.kind, desktop)
    return Check("Session", name, "warning", detail, fix)


def _tray_fix(kind: str, desktop: str) -> str:
    """How to get a tray where none was found, for this kind of session (waybar is Wayland-only)."""
    if kind == "x11":
        return (
            "add a notification area (system tray) to your desktop's panel, or with a bare window manager "
            "(openbox, i3, ...) run a panel that has one, such as `tint2` or `trayer`"
        )
    if desktop == "sway":
        return "give swaybar a tray (`tray_output` in its `bar` block), or add the `tray` module to waybar"
    return "add a StatusNotifier tray to your panel or bar (waybar: the `tray` module)"


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
