"""Before Qt starts: can the app open a window at all? If not, say why where the user will see it.

Qt ends the process with abort() (exit status 134, no log, nothing on screen) when no platform
plugin can be initialised: a system library of the xcb plugin is missing (``libxcb-cursor0`` since
Qt 6.5), or there is no display to connect to. Started from the app menu or at login, that is a
silent failure. `qt_problem` is called before the QApplication is created and predicts that case:

- The platforms Qt will try, in its order: ``QT_QPA_PLATFORM`` (a ``;``-separated list) when set,
  else ``wayland;xcb`` when ``WAYLAND_DISPLAY`` is set or ``XDG_SESSION_TYPE`` is ``wayland``,
  else ``xcb`` (what Qt 6 does; each tried until one works).
- For each: is its display there (``DISPLAY`` for xcb; the compositor's socket, ``WAYLAND_DISPLAY``
  or ``wayland-0`` in ``XDG_RUNTIME_DIR``, for Wayland), and does its plugin file load? The plugin
  is looked up where Qt looks (``QT_QPA_PLATFORM_PLUGIN_PATH``, ``QT_PLUGIN_PATH``/platforms, Qt's
  plugin folder) and loaded in this process with ``dlopen(RTLD_LAZY)``, as Qt's plugin loader does
  a moment later: the same dynamic loader, library path and environment, so the answer is Qt's own
  and neither a false alarm nor a miss. A failed dlopen maps nothing; a successful one loads what
  Qt would load next anyway. Reading the plugin's dependencies ourselves (ldd, an ELF parser) could
  disagree with the loader (RUNPATH, a bundle's LD_LIBRARY_PATH, symbol versions), and a child
  process would cost a second interpreter start (a frozen build has no ``python -c``). Measured on
  this project's test machine: 10-20 ms, most of it mapping Qt's libraries that the app needs next.
- The first usable platform ends the check. A platform whose plugin file is not found (a Qt
  installed elsewhere) counts as usable: only a certain failure stops the app.

When every platform fails, the message names the plugin's error and the install command for every
missing library of the Qt rows of `dictation.system_packages` (each tried with dlopen, so one
command installs them all). `refuse_to_start` then prints it on stderr, appends it to the log file
(its folder created 0700 first, the file 0600) and shows a desktop notification through
``notify-send`` where that exists (the message is about libraries and displays; nothing the user
dictated is ever in it), and the app exits with status 1.

Qt-free: the app passes Qt's plugin folder (QLibraryInfo); `dictation doctor` finds the PySide6
wheel's without importing Qt (`default_plugins_root`).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dictation import paths, spawn, system_packages

NOTIFY_TITLE = "Dictation cannot start"
NOTIFY_TIMEOUT_S = 3.0
QT_OWN = ("libQt6", "libicu", "libpyside6", "libshiboken6")  # libraries the PySide6 wheel carries
PYSIDE_FIX = "`pip install --force-reinstall PySide6-Essentials` in the app's environment"
SESSION_FIX = "start Dictation from inside your desktop session (its app menu, autostart, or a terminal there)"
_SONAME = re.compile(r"([^\s/:'`]+\.so(?:\.\d+)*)\b")


# --- where Qt looks ---------------------------------------------------------------------------------


def platform_candidates(env: Mapping[str, str]) -> list[str]:
    """The platform plugins Qt 6 tries, in order (see the module docstring)."""
    forced = env.get("QT_QPA_PLATFORM", "").strip()
    if forced:
        names = [entry.split(":", 1)[0].strip() for entry in forced.split(";")]
        return [name for name in names if name]
    if env.get("WAYLAND_DISPLAY") or env.get("XDG_SESSION_TYPE", "").lower() == "wayland":
        return ["wayland", "xcb"]
    return ["xcb"]


def default_plugins_root() -> Path | None:
    """Qt's plugin folder inside the installed PySide6 (wheel or PyInstaller bundle), found without
    importing it; None when PySide6 is not installed that way."""
    try:
        spec = importlib.util.find_spec("PySide6")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        root = Path(location) / "Qt" / "plugins"
        if root.is_dir():
            return root
    return None


def plugin_folders(env: Mapping[str, str], plugins_root: str | os.PathLike | None) -> list[Path]:
    folders: list[Path] = []
    if env.get("QT_QPA_PLATFORM_PLUGIN_PATH"):
        folders.append(Path(env["QT_QPA_PLATFORM_PLUGIN_PATH"]))
    folders += [Path(entry) / "platforms" for entry in env.get("QT_PLUGIN_PATH", "").split(os.pathsep) if entry]
    if plugins_root:
        folders.append(Path(plugins_root) / "platforms")
    return list(dict.fromkeys(folders))


def plugin_files(platform: str, folders: list[Path]) -> list[Path]:
    """The files that can serve ``platform`` in ``folders`` (Qt 6.12 serves every Wayland variant
    from libqwayland.so; older 6.x releases had libqwayland-egl.so and libqwayland-generic.so)."""
    stems = [f"libq{platform}.so"]
    if platform.startswith("wayland"):
        stems += ["libqwayland.so", "libqwayland-egl.so", "libqwayland-generic.so"]
    return [folder / stem for folder in folders for stem in dict.fromkeys(stems) if (folder / stem).is_file()]


def display_problem(platform: str, env: Mapping[str, str]) -> str:
    """Why ``platform`` has no display to connect to ("" when it looks reachable or needs none)."""
    if platform == "xcb":
        return "" if env.get("DISPLAY") else "DISPLAY is unset"
    if platform.startswith("wayland"):
        name = env.get("WAYLAND_DISPLAY") or "wayland-0"  # libwayland's default
        if os.path.isabs(name):
            socket = Path(name)
        elif env.get("XDG_RUNTIME_DIR"):
            socket = Path(env["XDG_RUNTIME_DIR"]) / name
        else:
            return "no Wayland compositor can be found: XDG_RUNTIME_DIR is unset"
        return "" if socket.exists() else f"no Wayland compositor at {socket}"
    return ""


def load_plugin(path: Path) -> None:
    """dlopen the plugin as Qt's plugin loader does (lazy binding); raises OSError with the loader's words."""
    ctypes.CDLL(str(path), mode=os.RTLD_LAZY | getattr(os, "RTLD_LOCAL", 0))


# --- the check ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One platform as Qt would try it: ``plugin`` the file tried (None: none found), ``load_error``
    the loader's message, ``display_error`` why there is no display ("" for none)."""

    platform: str
    plugin: Path | None
    load_error: str = ""
    display_error: str = ""

    @property
    def usable(self) -> bool:
        return not self.load_error and not self.display_error


def try_platforms(
    env: Mapping[str, str],
    plugins_root: str | os.PathLike | None,
    load: Callable[[Path], None] = load_plugin,
    *,
    check_display: bool = True,
) -> list[Attempt]:
    """The candidates in Qt's order, up to the first usable one (``check_display=False``: whether
    their plugins load, displays aside, as `dictation doctor` asks)."""
    attempts = []
    folders = plugin_folders(env, plugins_root)
    for platform in platform_candidates(env):
        files = plugin_files(platform, folders)
        display = display_problem(platform, env) if check_display else ""
        attempt = Attempt(platform, files[0] if files else None, display_error=display)
        if not attempt.display_error:
            attempt = try_plugin(attempt, files, load)
        attempts.append(attempt)
        if attempt.usable:
            break
    return attempts


def try_plugin(attempt: Attempt, files: list[Path], load: Callable[[Path], None]) -> Attempt:
    """``attempt`` with the first of ``files`` that loads, or the first one's error."""
    first_error: tuple[Path, str] | None = None
    for path in files:
        try:
            load(path)
        except OSError as exc:
            first_error = first_error or (path, _one_line(exc))
            continue
        return Attempt(attempt.platform, path, "", attempt.display_error)
    if first_error is None:
        return attempt
    return Attempt(attempt.platform, first_error[0], first_error[1], attempt.display_error)


def qt_problem(
    env: Mapping[str, str] | None = None,
    plugins_root: str | os.PathLike | None = None,
    *,
    platform: str | None = None,
    load: Callable[[Path], None] = load_plugin,
    load_library: Callable[[str], None] = system_packages.load_library,
) -> str:
    """Why Qt cannot start here, as one message with its fix; "" when it can (or when it cannot be
    told). Linux and the BSDs only: Windows and macOS have their own platform plugin in the wheel."""
    env = dict(os.environ if env is None else env)
    platform = sys.platform if platform is None else platform
    if platform.startswith(("win", "cygwin", "msys", "darwin")):
        return ""
    if plugins_root is None:
        plugins_root = default_plugins_root()
    detail, fix = failure(try_platforms(env, plugins_root, load), env, load_library)
    if not detail:
        return ""
    return f"{detail}: {fix}" if fix == SESSION_FIX else f"{detail}. Fix: {fix}, then start Dictation again"


def failure(
    attempts: list[Attempt],
    env: Mapping[str, str],
    load_library: Callable[[str], None] = system_packages.load_library,
) -> tuple[str, str]:
    """(what fails, its fix) when none of ``attempts`` is usable; ("", "") when one is, or none was made."""
    if not attempts or any(a.usable for a in attempts):
        return "", ""
    broken = [a for a in attempts if a.load_error]
    if not broken:
        why = "; ".join(a.display_error for a in attempts)
        return f"no graphical session to show the app in ({why})", SESSION_FIX
    if len(broken) == 1:
        what = f'its "{broken[0].platform}" platform plugin: {broken[0].load_error}'
    else:
        what = "its platform plugins: " + "; ".join(f'"{a.platform}": {a.load_error}' for a in broken)
    wayland = any(a.platform.startswith("wayland") for a in broken)
    fix = library_fix(
        [a.load_error for a in broken],
        ["qt", "qt-wayland"] if wayland else ["qt"],
        load_library,
        lambda tool: shutil.which(tool, path=env.get("PATH", os.defpath)),
    )
    return f"Qt cannot load {what}", fix


def library_fix(
    errors: list[str],
    groups: list[str],
    load_library: Callable[[str], None] = system_packages.load_library,
    which: Callable[[str], str | None] = shutil.which,
) -> str:
    """The install command for every library of ``groups`` that does not load here and every one the
    loader's ``errors`` name; reinstalling PySide6 when one of its own libraries is missing."""
    named = [m.group(1) for m in (_SONAME.search(e) for e in errors) if m]
    if any(name.startswith(QT_OWN) for name in named):
        return PYSIDE_FIX
    missing = list(system_packages.missing_libraries(system_packages.libraries(*groups), load_library))
    missing += [name for name in named if name not in missing and system_packages.for_library(name)]
    if not missing:
        missing = named
    if not missing:
        return f"install the system packages Qt needs (see `dictation doctor`), or {PYSIDE_FIX}"
    manager = system_packages.package_manager(which)
    return "install the missing system libraries: " + system_packages.fix_for_libraries(missing, manager)


def import_problem(exc: ImportError, which: Callable[[str], str | None] = shutil.which) -> str:
    """For an ImportError of PySide6 caused by a missing system library (libEGL.so.1, ...): the message
    with its fix; "" for any other ImportError."""
    text = _one_line(exc)
    match = _SONAME.search(text)
    if not match or not match.group(1).startswith("lib") or ".so" not in text:
        return ""
    fix = library_fix([text], ["qt"], which=which)
    return f"Qt's libraries cannot be loaded: {text}. Fix: {fix}, then start Dictation again"


# --- telling the user -----------------------------------------------------------------------------


def refuse_to_start(message: str, env: Mapping[str, str] | None = None) -> int:
    """Say ``message`` on stderr, in the log file and as a desktop notification; the exit status (1)."""
    env = dict(os.environ if env is None else env)
    print(f"dictation: error: {message}", file=sys.stderr, flush=True)
    try:
        log_error(message)
    except OSError as exc:
        print(f"dictation: (not written to the log: {exc.filename or ''}: {exc.strerror or exc})", file=sys.stderr)
    notify(message, env)
    return 1


def log_error(message: str) -> Path:
    """Append ``message`` as an ERROR line to the app's log file (folder 0700, file 0600); its path."""
    from dictation.private import private_dir

    folder = private_dir(paths.log_dir())
    path = folder / paths.LOG_FILE
    record = logging.LogRecord(__name__, logging.ERROR, __file__, 0, message, None, None)
    line = logging.Formatter(paths.LOG_FORMAT).format(record) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        st = os.fstat(fd)
        if hasattr(os, "fchmod") and st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.fchmod(fd, st.st_mode & 0o700)
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)
    return path


def notify(message: str, env: Mapping[str, str]) -> bool:
    """A desktop notification through ``notify-send`` (libnotify), if it is installed; whether one was sent."""
    tool = shutil.which("notify-send", path=env.get("PATH", os.defpath))
    if not tool:
        return False
    from dictation import resources

    icon = resources.file_on_disk(resources.icon_name(resources.APP_ICON))
    args = [
        tool,
        "--app-name=Dictation",
        "--urgency=critical",
        f"--icon={icon or 'dialog-error'}",
        NOTIFY_TITLE,
        message.replace("`", ""),
    ]
    try:
        done = spawn.run(
            args,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=NOTIFY_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
