"""The Hotkeys area: every hotkey backend as the app's own chooser sees it (which one it picks and
why the others can't be used, each with its fix) and, for the X11 backend, whether the keys can be
grabbed or another program holds them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dictation.doctor.check import DBUS_TIMEOUT_S, Check, Context

COMMANDS_SECTION = "README: 'Driving it from the command line (Wayland compositors)'"
BIND_COMMANDS_FIX = (
    "bind `dictation toggle` (or `dictation start` on press and `dictation stop` on release) to a key "
    f"in your desktop or compositor; see {COMMANDS_SECTION}"
)


def hotkey_factories() -> dict[str, Callable[[], Any]]:
    """The hotkey backends as the app builds them, with a short portal timeout (a diagnosis must be quick)."""
    from dictation.hotkeys.choose import default_factories
    from dictation.hotkeys.portal import PortalBackend

    return {**default_factories(), "portal": lambda: PortalBackend(call_timeout=DBUS_TIMEOUT_S)}


def checks(ctx: Context) -> list[Check]:
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
