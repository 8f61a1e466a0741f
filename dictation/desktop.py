"""Linux desktop integration: the app-menu entry, its icon and an optional systemd user unit.

``dictation install-desktop`` writes (XDG base directories; the defaults when the variables are
unset or relative, as the spec says):

- ``$XDG_DATA_HOME/applications/dictation.desktop`` (``~/.local/share``): the packaged template
  (`dictation.resources.desktop_template`, the same one the autostart entry uses) with
  ``Icon=dictation`` and the command of `dictation.autostart.launch_command`: the absolute path of
  the interpreter running now with ``-m dictation`` (a frozen build: its own executable), so the
  entry starts this installation (venv, pipx, conda) whatever the desktop's PATH holds;
- the app icon as ``dictation.png`` in ``$XDG_DATA_HOME/icons/hicolor/<N>x<N>/apps/`` for every
  packaged PNG size, and as ``dictation.svg`` in ``hicolor/scalable/apps/``;
- with ``--systemd``, also ``$XDG_CONFIG_HOME/systemd/user/dictation.service`` (``~/.config``):
  the packaged unit with ``ExecStart=`` that same command, started with the graphical session once
  the user runs ``systemctl --user enable --now dictation``. Use it *or* "Start at login", not both
  (both would start the app; the second start only brings its settings window forward).

``dictation install-desktop --uninstall`` removes them again, together with the enablement link
``systemctl --user enable`` made. As with the autostart entry, the .desktop and .service files
carry `MARKER` and are removed only when they do: a file the user wrote is left alone and named
in the report. Writing again overwrites our own files, so running the command after moving the
installation brings the command up to date. Writes are atomic.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dictation import resources
from dictation.autostart import desktop_exec, launch_command
from dictation.config.store import atomic_write

APP_ID = "dictation"  # the desktop file id (dictation.desktop), the icon name and the unit name
MARKER = "Written by `dictation install-desktop`; `dictation install-desktop --uninstall` removes this file."
SYSTEMD_ENABLE = "systemctl --user daemon-reload && systemctl --user enable --now dictation"


class DesktopError(OSError):
    """A file cannot be written or removed; the message is one line for the user."""


def _xdg(variable: str, default: str) -> Path:
    value = os.environ.get(variable, "")
    return Path(value) if os.path.isabs(value) else Path.home() / default  # relative values are ignored


def data_home() -> Path:
    return _xdg("XDG_DATA_HOME", ".local/share")


def config_home() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config")


def desktop_entry_path() -> Path:
    return data_home() / "applications" / f"{APP_ID}.desktop"


def icon_paths() -> dict[str, Path]:
    """Packaged resource name -> where it goes in the user's hicolor icon theme."""
    hicolor = data_home() / "icons" / "hicolor"
    paths = {
        resources.png_icon_name(resources.APP_ICON, size): hicolor / f"{size}x{size}" / "apps" / f"{APP_ID}.png"
        for size in resources.PNG_SIZES
    }
    paths[resources.icon_name(resources.APP_ICON)] = hicolor / "scalable" / "apps" / f"{APP_ID}.svg"
    return paths


def service_path() -> Path:
    return config_home() / "systemd" / "user" / f"{APP_ID}.service"


def systemd_exec(args: list[str]) -> str:
    """``args`` as a systemd ExecStart value: ``%`` and ``$`` doubled (specifiers and variables),
    arguments with blanks, quotes, backslashes or ``;`` in double quotes with C-style escapes."""
    quoted = []
    for arg in args:
        arg = arg.replace("%", "%%").replace("$", "$$")
        if not arg or any(ch in arg for ch in " \t\n\r\"'\\;"):
            escaped = arg.replace("\\", "\\\\").replace('"', '\\"')
            arg = '"' + escaped.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r") + '"'
        quoted.append(arg)
    return " ".join(quoted)


def render_desktop_entry(command: list[str] | None = None) -> bytes:
    """The app-menu entry: the packaged template with ``Exec=`` the command and ``Icon=dictation``."""
    command = launch_command() if command is None else command
    body = resources.desktop_template().replace("{exec}", desktop_exec(command)).replace("{icon}", APP_ID)
    return f"# {MARKER}\n{body.rstrip()}\n".encode()


def render_service(command: list[str] | None = None) -> bytes:
    """The systemd user unit: the packaged template with ``ExecStart=`` the command."""
    command = launch_command() if command is None else command
    body = resources.service_template().replace("{exec}", systemd_exec(command))
    return f"# {MARKER}\n{body.rstrip()}\n".encode()


def install(systemd: bool = False) -> list[str]:
    """Write the menu entry and icons (and the unit with ``systemd``); returns report lines.

    A .desktop or .service file at our path that we did not write is left alone (reported)."""
    _check_platform()
    report: list[str] = []
    for name, target in icon_paths().items():
        _write(target, resources.read_bytes(name))
    report.append(f"icons: {data_home() / 'icons' / 'hicolor'}/*/apps/{APP_ID}.{{png,svg}}")
    targets = [(desktop_entry_path(), render_desktop_entry())]
    if systemd:
        targets.append((service_path(), render_service()))
    for path, content in targets:
        if _foreign(path):
            report.append(f"left alone: {path} was not written by Dictation (remove it to let this command write it)")
            continue
        _write(path, content)
        report.append(f"wrote {path}")
    if systemd and not _foreign(service_path()):
        report.append(f"to start Dictation with your desktop session: {SYSTEMD_ENABLE}")
        from dictation.autostart import is_enabled

        if is_enabled():
            report.append(
                "note: 'Start at login' is on as well; turn it off in Settings so the app is not started twice"
            )
    return report


def uninstall() -> list[str]:
    """Remove what `install` wrote (our .desktop and .service only, plus the unit's enablement links)."""
    _check_platform()
    report: list[str] = []
    for path in (desktop_entry_path(), service_path()):
        if not path.exists() and not path.is_symlink():
            continue
        if _foreign(path):
            report.append(f"left alone: {path} was not written by Dictation")
            continue
        if path == service_path():
            for link in _enablement_links(path):
                _remove(link)
                report.append(f"removed {link}")
        _remove(path)
        report.append(f"removed {path}")
        if path == service_path():
            report.append("then: systemctl --user daemon-reload (and quit the app if the service is running)")
    removed_icons = 0
    for target in icon_paths().values():
        if target.is_file():
            _remove(target)
            removed_icons += 1
    if removed_icons:
        report.append(f"removed {removed_icons} icons from {data_home() / 'icons' / 'hicolor'}")
    if not report:
        report.append("nothing to remove")
    return report


def _check_platform() -> None:
    if sys.platform.startswith(("win", "cygwin", "msys")) or sys.platform == "darwin":
        raise DesktopError(
            "install-desktop is for Linux and other XDG desktops; elsewhere use Settings > Start at login"
        )


def _foreign(path: Path) -> bool:
    """True if ``path`` exists and does not carry our marker."""
    try:
        return MARKER not in path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return path.is_symlink()  # a dangling link is not ours either
    except OSError:
        return True


def _enablement_links(unit: Path) -> list[Path]:
    """The ``*.wants``/``*.requires`` links to ``unit`` that ``systemctl --user enable`` made."""
    links = []
    for folder in unit.parent.glob("*.*"):
        link = folder / unit.name
        if folder.is_dir() and folder.suffix in (".wants", ".requires") and link.is_symlink():
            target = Path(os.readlink(link))
            if os.path.normpath(target if target.is_absolute() else folder / target) == os.path.normpath(unit):
                links.append(link)
    return sorted(links)


def _write(path: Path, content: bytes) -> None:
    try:
        atomic_write(path, content)
    except OSError as exc:
        raise DesktopError(f"cannot write {path}: {exc.strerror or exc}") from None


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise DesktopError(f"cannot remove {path}: {exc.strerror or exc}") from None
