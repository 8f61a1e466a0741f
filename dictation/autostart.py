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

`refresh` is what the app calls at every start while the setting is on: it writes the entry when it
is missing and rewrites ours when its content differs (an interpreter that moved, an older
template), so the entry never keeps starting a removed virtual environment. An entry switched off
in the desktop's own settings, or one the user wrote, is left as it is. `read_entry` reads the
command back (`parse_desktop_exec` for the Exec key) for `dictation doctor`, which checks that its
program exists.

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
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
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


def refresh(platform: str | None = None) -> Path | None:
    """At a start with the setting on: write the entry if it is missing, rewrite ours if it differs
    from what `render_entry` makes now; the path when it was written, None when left as it is (up to
    date, switched off in the desktop's settings, or the user's own). Raises AutostartError."""
    path = autostart_path(platform)
    wanted = render_entry(platform)
    try:
        current = path.read_bytes() if path.is_file() else None
    except OSError as exc:
        raise AutostartError(f"cannot read {path}: {exc.strerror or exc}") from None
    if current is None and path.exists():
        return None  # a folder or other odd thing in its place: not ours to replace
    if current is not None:
        text = current.decode("utf-8", errors="replace")
        if current == wanted or MARKER not in text or (_kind(platform) == "xdg" and _switched_off(text)):
            return None
    try:
        atomic_write(path, wanted)
    except OSError as exc:
        raise AutostartError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


@dataclass(frozen=True)
class Entry:
    """An autostart file as found: whether we wrote it, whether it starts the app at login, and the
    command it runs (None when it cannot be read back)."""

    path: Path
    ours: bool
    enabled: bool
    command: list[str] | None


def read_entry(platform: str | None = None) -> Entry | None:
    """The autostart file for ``platform`` and the command it runs; None when there is none."""
    path = autostart_path(platform)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        return Entry(path, False, path.exists(), None) if path.exists() else None
    text = raw.decode("utf-8", errors="replace")
    kind = _kind(platform)
    if kind == "xdg":
        value = _desktop_value(text, "Exec")
        command = parse_desktop_exec(value) if value is not None else None
    elif kind == "windows":
        command = _windows_command(text)
    else:
        try:
            args = plistlib.loads(raw).get("ProgramArguments")
        except Exception:  # noqa: BLE001 - any unreadable plist is "no command"
            args = None
        command = [str(a) for a in args] if isinstance(args, list) and args else None
    return Entry(path, MARKER in text, kind != "xdg" or not _switched_off(text), command or None)


def missing_program(command: list[str], env: Mapping[str, str] | None = None) -> str:
    """Why ``command``'s program cannot be started ("" when it can): no such file, or not executable."""
    env = os.environ if env is None else env
    program = command[0]
    if not os.path.isabs(program):
        found = shutil.which(program, path=env.get("PATH", os.defpath))
        return "" if found else f"{program} is not found on PATH"
    if not os.path.isfile(program):
        return f"{program} does not exist"
    if not os.access(program, os.X_OK):
        return f"{program} is not executable"
    return ""


def parse_desktop_exec(value: str) -> list[str]:
    """A .desktop file's Exec value as arguments (the inverse of `desktop_exec`): string escapes
    first, then double-quoted arguments with their four backslash escapes, then ``%%`` to ``%``;
    field codes (``%f``, ``%U``, ...) are dropped."""
    escapes = {"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
    text, i = "", 0
    while i < len(value):
        if value[i] == "\\" and i + 1 < len(value) and value[i + 1] in escapes:
            text, i = text + escapes[value[i + 1]], i + 2
        else:
            text, i = text + value[i], i + 1
    args: list[str] = []
    current: str | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in " \t\n":
            if current is not None:
                args.append(current)
            current, i = None, i + 1
        elif ch == '"':
            current, i = current or "", i + 1
            while i < len(text) and text[i] != '"':
                if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in '"`$\\':
                    i += 1
                current, i = current + text[i], i + 1
            i += 1
        else:
            current, i = (current or "") + ch, i + 1
    if current is not None:
        args.append(current)
    out = []
    for arg in args:
        if len(arg) == 2 and arg[0] == "%" and arg[1] != "%":
            continue  # a field code
        out.append(arg.replace("%%", "%"))
    return out


def _desktop_value(text: str, wanted: str) -> str | None:
    """The value of key ``wanted`` in the [Desktop Entry] group."""
    in_entry = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            in_entry = line == "[Desktop Entry]"
            continue
        key, sep, value = line.partition("=")
        if in_entry and sep and key.strip() == wanted:
            return value.strip()
    return None


def _windows_command(text: str) -> list[str] | None:
    """The program and arguments of our batch file's ``start "" "<program>" args`` line."""
    for line in text.splitlines():
        rest = line.strip()
        if not rest.lower().startswith('start ""'):
            continue
        rest = rest[len('start ""') :].strip()
        if rest.startswith('"'):
            program, _, tail = rest[1:].partition('"')
        else:
            program, _, tail = rest.partition(" ")
        return [program.replace("%%", "%"), *tail.split()]
    return None


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
    hidden = (_desktop_value(text, "Hidden") or "").lower() == "true"
    return hidden or (_desktop_value(text, "X-GNOME-Autostart-enabled") or "").lower() == "false"


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
