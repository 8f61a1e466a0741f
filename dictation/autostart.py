"""Start the app at login: one small file per platform, written when enabled, removed when disabled.

- Linux and other XDG desktops: ``$XDG_CONFIG_HOME/autostart/dictation.desktop`` (``~/.config``
  when unset), ``Exec=<python> -m dictation``.
- Windows: ``dictation.cmd`` in the Startup folder
  (``%APPDATA%\\Microsoft\\Windows\\Start Menu\\Programs\\Startup``): ``start "" <pythonw> -m dictation``.
- macOS: the LaunchAgent ``~/Library/LaunchAgents/io.github.dictation.plist`` with
  ProgramArguments and RunAtLoad.

The command is the absolute path of the interpreter running now with ``-m dictation`` (for a frozen
build: its executable), not the ``dictation`` script looked up on PATH: the login session's PATH
often lacks ``~/.local/bin`` or a virtual environment's ``bin``, and an absolute interpreter keeps
starting the installation the user turned the setting on from (venv, pipx, conda). Enabling again
rewrites the file, so calling ``set_enabled(settings.general.start_at_login)`` at every start
keeps the command current when the installation moves. On Windows ``pythonw.exe`` (a frozen
build: ``dictationw.exe``) is used when it sits beside the executable, so no console window stays
open. `dictation.desktop` (``dictation install-desktop``) writes the app-menu entry with the same
command and template.

Every file we write carries `MARKER` (a comment), and only such a file is ever removed: an entry
the user wrote by hand is left alone. Disabling while one exists raises `AutostartError`; enabling
while an enabled one exists keeps it (it already starts the app). Writes are atomic.

The Linux entry is the packaged app-menu template (`dictation.resources.desktop_template`) with
``X-GNOME-Autostart-enabled=true`` added. ``Hidden=true`` or ``X-GNOME-Autostart-enabled=false``
(what desktop settings tools write to switch an entry off) count as disabled.
"""

from __future__ import annotations

import os
import plistlib
import sys
from pathlib import Path

from dictation import resources
from dictation.config.store import atomic_write

MARKER = 'Written by Dictation\'s "Start at login" setting; turning the setting off removes this file.'
LAUNCH_AGENT_LABEL = "io.github.dictation"
FALLBACK_ICON = "audio-input-microphone"  # a standard icon name, if the package is not on disk

# Characters that force an Exec argument into double quotes (Desktop Entry spec, "The Exec key").
_EXEC_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


class AutostartError(OSError):
    """The autostart entry cannot be written or removed; the message is one line for the user.

    An OSError, as every failure here is about a file: callers catching OSError catch it too."""


def _kind(platform: str | None) -> str:
    platform = sys.platform if platform is None else platform
    if platform.startswith(("win", "cygwin", "msys")):
        return "windows"
    if platform == "darwin":
        return "macos"
    return "xdg"


def autostart_path(platform: str | None = None) -> Path:
    """Where the autostart entry lives for ``platform`` (default: this one)."""
    kind = _kind(platform)
    if kind == "windows":
        appdata = os.environ.get("APPDATA") or str(Path.home() / "AppData" / "Roaming")
        return Path(appdata, "Microsoft", "Windows", "Start Menu", "Programs", "Startup", "dictation.cmd")
    if kind == "macos":
        return Path.home() / "Library" / "LaunchAgents" / f"{LAUNCH_AGENT_LABEL}.plist"
    config = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(config) if os.path.isabs(config) else Path.home() / ".config"  # the spec ignores relative ones
    return base / "autostart" / "dictation.desktop"


def launch_command(platform: str | None = None) -> list[str]:
    """The program and arguments that start the app (see the module docstring for why these)."""
    executable = sys.executable
    if getattr(sys, "frozen", False):
        # The PyInstaller build (packaging/pyinstaller) has dictationw.exe, without a console, beside
        # dictation.exe on Windows.
        windowless = Path(executable).with_name("dictationw.exe")
        if _kind(platform) == "windows" and windowless.is_file():
            return [str(windowless)]
        return [executable]
    if _kind(platform) == "windows":
        windowless = Path(executable).with_name("pythonw.exe")
        if windowless.is_file():
            executable = str(windowless)
    return [executable, "-m", "dictation"]


def is_enabled(platform: str | None = None) -> bool:
    """True if an autostart entry (ours or the user's) will start the app at login."""
    path = autostart_path(platform)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return False
    except OSError:
        return path.exists()
    return _kind(platform) != "xdg" or not _switched_off(text)


def set_enabled(enabled: bool, platform: str | None = None) -> Path:
    """Write (``enabled``) or remove our autostart entry; returns its path.

    Raises AutostartError when the file cannot be written or removed, or when disabling would
    mean deleting an entry that we did not write.
    """
    path = autostart_path(platform)
    try:
        current = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None
    except OSError as exc:
        raise AutostartError(f"cannot read {path}: {exc.strerror or exc}") from None
    ours = current is not None and MARKER in current
    if not enabled:
        if current is None and not path.exists():
            return path
        if not ours:
            raise AutostartError(
                f"{path} was not written by Dictation, so it is left alone; remove it yourself to stop the app "
                "starting at login"
            )
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise AutostartError(f"cannot remove {path}: {exc.strerror or exc}") from None
        return path
    if current is not None and not ours and is_enabled(platform):
        return path  # the user's own entry already starts the app
    try:
        atomic_write(path, render_entry(platform))
    except OSError as exc:
        raise AutostartError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def render_entry(platform: str | None = None) -> bytes:
    """The content of our autostart file for ``platform``."""
    kind, command = _kind(platform), launch_command(platform)
    if kind == "windows":
        return _windows_cmd(command)
    if kind == "macos":
        return _launch_agent(command)
    return _desktop_entry(command)


def desktop_exec(args: list[str]) -> str:
    """``args`` as the value of a .desktop file's Exec key, quoted and escaped per the spec.

    An argument with a reserved character (space, quote, ``$``, ...) goes in double quotes, where
    the four characters double quote, backtick, dollar and backslash get a backslash; ``%`` is
    doubled (``%f`` etc. are field codes); then the whole value is escaped as any string value
    (backslash doubled, newline as ``\\n``), so a backslash in a quoted argument becomes four.
    """
    quoted = []
    for arg in args:
        arg = arg.replace("%", "%%")
        if not arg or any(ch in _EXEC_RESERVED for ch in arg):
            arg = '"' + "".join("\\" + ch if ch in '"`$\\' else ch for ch in arg) + '"'
        quoted.append(arg)
    line = " ".join(quoted)
    return line.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def _desktop_entry(command: list[str]) -> bytes:
    icon = resources.file_on_disk(resources.icon_name(resources.APP_ICON))
    icon_value = str(icon).replace("\\", "\\\\") if icon is not None else FALLBACK_ICON
    body = resources.desktop_template().replace("{exec}", desktop_exec(command)).replace("{icon}", icon_value)
    return f"# {MARKER}\n{body.rstrip()}\nX-GNOME-Autostart-enabled=true\n".encode()


def _switched_off(text: str) -> bool:
    """Whether a .desktop entry says not to autostart (Hidden=true, X-GNOME-Autostart-enabled=false)."""
    in_entry = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            in_entry = line == "[Desktop Entry]"
            continue
        key, sep, value = line.partition("=")
        if not in_entry or not sep:
            continue
        key, value = key.strip(), value.strip().lower()
        if (key == "Hidden" and value == "true") or (key == "X-GNOME-Autostart-enabled" and value == "false"):
            return True
    return False


def _windows_cmd(command: list[str]) -> bytes:
    """A batch file that starts the app detached and exits (its console closes at once).

    chcp 65001 comes first so that the following lines, written in UTF-8, are read as UTF-8 (cmd
    decodes a batch file line by line with the current code page): a user name like "José" stays
    intact. ``%`` is doubled, as batch files expand ``%...%``.
    """
    args = " ".join('"' + arg.replace("%", "%%") + '"' if i == 0 else arg for i, arg in enumerate(command))
    lines = ["@echo off", "chcp 65001 >nul", f"rem {MARKER}", f'start "" {args}', ""]
    return "\r\n".join(lines).encode("utf-8")


def _launch_agent(command: list[str]) -> bytes:
    agent = {
        "Label": LAUNCH_AGENT_LABEL,
        "ProgramArguments": command,
        "RunAtLoad": True,
        "ProcessType": "Interactive",
        "LimitLoadToSessionType": "Aqua",  # a GUI login, not ssh
    }
    xml = plistlib.dumps(agent, fmt=plistlib.FMT_XML).decode("utf-8")
    # plistlib writes no comments and launchd warns about unknown keys: the marker is an XML comment.
    return xml.replace("<plist ", f"<!-- {MARKER} -->\n<plist ", 1).encode("utf-8")
