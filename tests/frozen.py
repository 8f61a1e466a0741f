"""Making this process look like the frozen (PyInstaller) app, for the tests of what its children get.

PyInstaller's bootloader puts the bundle's ``_internal`` folder in front of LD_LIBRARY_PATH (keeping
the user's value as LD_LIBRARY_PATH_ORIG) and sets its own ``_PYI_*`` variables; its PySide6 runtime
hook points QT_PLUGIN_PATH and QML2_IMPORT_PATH into the bundle. (The variables and values are those
of a real build: PyInstaller 6.22.3, read from /proc/PID/environ of the running app.) `simulate_frozen` sets all of that
(sys.frozen, sys._MEIPASS included) with monkeypatch, so it is undone after the test.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

USER_LIBRARY_PATH = "/opt/users-own/lib"
USER_QT_PLUGIN_PATH = "/usr/lib/x86_64-linux-gnu/qt6/plugins"


def simulate_frozen(monkeypatch, tmp_path: Path, *, user_library_path: str | None = USER_LIBRARY_PATH) -> Path:
    """The bundle folder (``<tmp>/dist/dictation/_internal``) of a simulated frozen app.

    ``user_library_path``: the LD_LIBRARY_PATH the user started the app with (None: none)."""
    bundle = tmp_path / "dist" / "dictation" / "_internal"
    (bundle / "PySide6" / "Qt" / "plugins").mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(bundle), raising=False)
    if user_library_path is None:
        monkeypatch.delenv("LD_LIBRARY_PATH_ORIG", raising=False)
        monkeypatch.setenv("LD_LIBRARY_PATH", str(bundle))
    else:
        monkeypatch.setenv("LD_LIBRARY_PATH_ORIG", user_library_path)
        monkeypatch.setenv("LD_LIBRARY_PATH", os.pathsep.join([str(bundle), user_library_path]))
    monkeypatch.setenv("QT_PLUGIN_PATH", str(bundle / "PySide6" / "Qt" / "plugins"))
    monkeypatch.setenv("QML2_IMPORT_PATH", str(bundle / "PySide6" / "Qt" / "qml"))
    monkeypatch.setenv("_PYI_ARCHIVE_FILE", str(bundle.parent / "dictation"))
    monkeypatch.setenv("_PYI_PARENT_PROCESS_LEVEL", "-1")
    monkeypatch.setenv("_PYI_LINUX_PROCESS_NAME", "dictation")
    return bundle


def bundle_variables(env: dict[str, str], bundle: Path) -> dict[str, str]:
    """The variables of ``env`` that still point into ``bundle`` or are the bootloader's own."""
    return {
        k: v
        for k, v in env.items()
        if str(bundle) in v or k.startswith("_PYI_") or (k.endswith("_ORIG") and k.startswith(("LD_", "LIBPATH")))
    }


def fake_tool(bin_dir: Path, name: str, out: Path, stdout: str = "") -> Path:
    """An executable ``name`` in ``bin_dir`` that writes its arguments, its environment (`env`) and its
    stdin to ``out``, prints ``stdout`` and exits 0: a stand-in for xdotool, nvidia-smi or xdg-open that
    shows what a real child process receives. ``out`` gets "ARGS: ...", "ENV", the `env` lines, "STDIN", stdin."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / name
    tool.write_text(
        "#!/bin/sh\n"
        f"{{ echo \"ARGS: $*\"; echo ENV; env; echo STDIN; cat; }} > '{out}.part'\n"
        f"mv '{out}.part' '{out}'\n"
        f"printf '%s' '{stdout}'\n",
        encoding="utf-8",
    )
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return tool


def read_fake_tool(out: Path) -> tuple[str, dict[str, str], str]:
    """(arguments, environment, stdin) that a `fake_tool` run recorded."""
    text = out.read_text(encoding="utf-8")
    head, rest = text.split("\nENV\n", 1)
    env_text, stdin = rest.split("STDIN\n", 1)
    env = dict(line.split("=", 1) for line in env_text.splitlines() if "=" in line)
    return head.removeprefix("ARGS: "), env, stdin
