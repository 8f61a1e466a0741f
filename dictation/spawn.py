"""Starting other programs with the environment the user started the app with.

Every process the app starts goes through here: the typing and clipboard tools (xdotool, xclip,
xsel, wl-copy, ydotool, ... through `dictation.output.process.SystemHost`), `nvidia-smi`,
`dictation doctor --json` for the Diagnostics page, the pattern matcher's child, and the file
manager that "Open log folder" starts (a test fails on a direct `subprocess` call elsewhere).

In a source or pip install the environment is passed on as it is. The frozen (PyInstaller) app
changes its own environment for its bundled code, and a child must not inherit that:

- the bootloader points ``LD_LIBRARY_PATH`` (``LIBPATH`` on AIX) at the bundle's ``_internal``
  folder and keeps the user's value as ``LD_LIBRARY_PATH_ORIG``: xdotool or a file manager
  would load the bundle's libraries instead of the system's. The child gets the ``_ORIG`` value,
  or, when there is none (the user had no ``LD_LIBRARY_PATH``), the variable without the bundle's
  entries: none at all when that was all it held;
- PyInstaller's PySide6 runtime hook sets ``QT_PLUGIN_PATH`` and ``QML2_IMPORT_PATH`` to the
  bundle's Qt (a Qt or KDE program started from the app would load our Qt's plugins); on Windows
  and macOS it puts the bundle on ``PATH`` / ``DYLD_LIBRARY_PATH``. Values inside the bundle go;
  the user's own values come back where the app's first runtime hook recorded them
  (`remember_user_environment`, packaging/pyinstaller/rthook_user_env.py), else the variable is dropped;
- the bootloader's own ``_PYI_*`` variables go, so that a frozen child (the app starting itself)
  sets itself up afresh instead of taking the parent's state for its own.

Setting ``LD_LIBRARY_PATH`` back in this process would not help: the dynamic loader reads it once,
at start-up.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

# Set by PyInstaller's bootloader, which keeps the user's value as <name>_ORIG.
LIBRARY_PATH_VARIABLES = ("LD_LIBRARY_PATH", "LIBPATH")
# Set or extended by PyInstaller's runtime hooks to point into the bundle.
BUNDLE_PATH_VARIABLES = ("QT_PLUGIN_PATH", "QML2_IMPORT_PATH", "PATH", "DYLD_LIBRARY_PATH")
BOOTLOADER_PREFIXES = ("_PYI_", "_MEIPASS")

# What BUNDLE_PATH_VARIABLES held before PyInstaller's runtime hooks ran (None: not set), recorded by
# the frozen app's first runtime hook; empty in a source install.
_before_runtime_hooks: dict[str, str | None] = {}


def frozen_bundle() -> Path | None:
    """The frozen app's bundle folder (``sys._MEIPASS``), or None when not frozen."""
    if not getattr(sys, "frozen", False):
        return None
    bundle = getattr(sys, "_MEIPASS", None)
    return Path(bundle) if bundle else None


def remember_user_environment(environ: Mapping[str, str] | None = None) -> None:
    """Record the variables PyInstaller's runtime hooks are about to change (called before they run)."""
    environ = os.environ if environ is None else environ
    _before_runtime_hooks.clear()
    _before_runtime_hooks.update({name: environ.get(name) for name in BUNDLE_PATH_VARIABLES})


def _inside(path: str, bundle: Path) -> bool:
    if not path:
        return False
    try:
        resolved = Path(os.path.abspath(path))
    except (OSError, ValueError):
        return False
    return resolved == bundle or bundle in resolved.parents


def _without_bundle(value: str, bundle: Path) -> str | None:
    """``value`` (a path list) without the entries inside ``bundle``; None when nothing is left."""
    return os.pathsep.join(p for p in value.split(os.pathsep) if p and not _inside(p, bundle)) or None


def user_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) as the user had it, for a child process.

    Idempotent: an environment made by this function comes back unchanged."""
    env = dict(os.environ if base is None else base)
    bundle = frozen_bundle()
    if bundle is None:
        return env
    bundle = Path(os.path.abspath(bundle))
    restored: dict[str, str | None] = {}
    for name in LIBRARY_PATH_VARIABLES:
        if f"{name}_ORIG" in env:
            restored[name] = env.pop(f"{name}_ORIG")
    for name in (*LIBRARY_PATH_VARIABLES, *BUNDLE_PATH_VARIABLES):
        value = env.get(name)
        if name in restored or value is None or not any(_inside(p, bundle) for p in value.split(os.pathsep)):
            continue  # restored above, unset, or not pointing into the bundle (the user's own value)
        if name in _before_runtime_hooks:
            restored[name] = _before_runtime_hooks[name]
        else:
            restored[name] = _without_bundle(value, bundle)
    for name, value in restored.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    for name in [n for n in env if n.startswith(BOOTLOADER_PREFIXES)]:
        del env[name]
    return env


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run` with the user's environment (``env``: the whole environment, default ours)."""
    return subprocess.run(list(argv), env=user_environment(env), **kwargs)


def start_detached(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> bool:
    """Start a program that outlives its purpose here (a file manager): no pipes, its own session,
    reaped in the background. False (and a log line) when it cannot be started."""
    try:
        proc = subprocess.Popen(
            list(argv),
            env=user_environment(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=os.name == "posix",
        )
    except OSError as exc:
        log.warning("could not start %s: %s", os.path.basename(argv[0]), exc)
        return False
    threading.Thread(target=proc.wait, name=f"reap-{os.path.basename(argv[0])}", daemon=True).start()
    return True
