"""`dictation doctor` on what decides whether the app can start: Qt's
platform plugin and system libraries, with the install command for what is missing, and the
"Start at login" entry, whose program must exist. A hidden library is an empty file of its name on
LD_LIBRARY_PATH (tests/test_preflight.py); the loader's answers are also injected where the
machine cannot produce them (a Wayland plugin that fails while xcb works)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dictation import autostart, doctor, preflight, system_packages
from dictation.config.settings import Settings
from dictation.doctor import run_checks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: Qt's xcb plugin, XDG autostart")


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DICTATION_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(doctor.session, "bus_name_has_owner", lambda name, env=None: None)


@pytest.fixture
def bin_dir(tmp_path) -> Path:
    """A PATH folder with a do-nothing package manager (apt unless a test adds another)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "apt").write_text("#!/bin/sh\nexit 0\n")
    (folder / "apt").chmod(0o755)
    return folder


def session(env: dict[str, str], settings: Settings | None = None) -> dict[str, doctor.Check]:
    checks = run_checks(settings or Settings(), env=env, platform="linux", areas=["Session"])
    return {c.name: c for c in checks}


def x11(bin_dir: Path, **more: str) -> dict[str, str]:
    return {"PATH": str(bin_dir), "XDG_SESSION_TYPE": "x11", "DISPLAY": ":0", **more}


# --- Qt -----------------------------------------------------------------------------------------


def test_the_doctor_command_names_a_missing_qt_library_and_its_package(tmp_path, bin_dir):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "libxcb-cursor.so.0").write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if not k.startswith("QT_") and k != "WAYLAND_DISPLAY"}
    env.update(x11(bin_dir), LD_LIBRARY_PATH=str(hidden), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(
        [sys.executable, "-m", "dictation", "doctor", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    qt = next(c for c in json.loads(proc.stdout)["checks"] if (c["area"], c["name"]) == ("Session", "Qt"))
    assert qt["status"] == "problem"
    assert qt["detail"] == f'Qt cannot load its "xcb" platform plugin: {hidden}/libxcb-cursor.so.0: file too short'
    assert qt["fix"] == "install the missing system libraries: `sudo apt install libxcb-cursor0`"


def test_qt_loads_here(bin_dir):
    qt = session(x11(bin_dir))["Qt"]
    assert qt.status == "ok", qt
    assert qt.detail.startswith("PySide6 ") and qt.detail.endswith("platforms/libqxcb.so)")
    assert '"xcb" platform plugin loads' in qt.detail


def test_qt_is_checked_without_a_display_too(bin_dir):
    """Over ssh the display row says there is none; the Qt row still checks the libraries."""
    qt = session({"PATH": str(bin_dir)})["Qt"]
    assert qt.status == "ok" and '"xcb" platform plugin loads' in qt.detail


def test_a_wayland_plugin_that_cannot_load_is_a_warning_with_its_package(bin_dir, monkeypatch):
    real = preflight.load_plugin

    def load(path: Path) -> None:
        if path.name == "libqwayland.so":
            raise OSError("libwayland-cursor.so.0: cannot open shared object file: No such file or directory")
        real(path)

    real_library = system_packages.load_library

    def load_library(soname: str) -> None:
        if soname == "libwayland-cursor.so.0":
            raise OSError(f"{soname}: cannot open shared object file: No such file or directory")
        real_library(soname)

    monkeypatch.setattr(preflight, "load_plugin", load)
    monkeypatch.setattr(system_packages, "load_library", load_library)
    rows = session(x11(bin_dir, XDG_SESSION_TYPE="wayland", WAYLAND_DISPLAY="wayland-1"))
    assert rows["Qt"].status == "ok" and '"xcb" platform plugin loads' in rows["Qt"].detail
    wayland = rows["Qt on Wayland"]
    assert wayland.status == "warning"
    assert wayland.detail == (
        'the "wayland" platform plugin cannot load (libwayland-cursor.so.0: cannot open shared object file: No such '
        "file or directory): windows go through XWayland instead"
    )
    assert wayland.fix == "install the missing system libraries: `sudo apt install libwayland-cursor0`"


def test_a_missing_library_of_qt_is_a_problem_even_when_the_plugin_loads(bin_dir, monkeypatch):
    (bin_dir / "dnf").write_text("#!/bin/sh\n")
    (bin_dir / "dnf").chmod(0o755)
    (bin_dir / "apt").unlink()
    real = system_packages.load_library

    def load_library(soname: str) -> None:
        if soname == "libgssapi_krb5.so.2":  # QtNetwork's: the app's socket server could not be imported
            raise OSError(f"{soname}: cannot open shared object file: No such file or directory")
        real(soname)

    monkeypatch.setattr(system_packages, "load_library", load_library)
    qt = session(x11(bin_dir))["Qt"]
    assert qt.status == "problem"
    assert qt.detail == (
        "system libraries Qt needs are missing: libgssapi_krb5.so.2: cannot open shared object file: No such file or "
        "directory"
    )
    assert qt.fix == "`sudo dnf install krb5-libs`"


def test_qt_installed_elsewhere_is_not_judged(bin_dir, monkeypatch):
    monkeypatch.setattr(preflight, "default_plugins_root", lambda: None)
    qt = session(x11(bin_dir))["Qt"]
    assert qt.status == "info" and "not checked here" in qt.detail
    checks = run_checks(Settings(), env=x11(bin_dir), platform="win32", areas=["Session"])
    assert "Qt" not in {c.name for c in checks}


# --- Start at login -----------------------------------------------------------------------------


def on() -> Settings:
    settings = Settings()
    return settings.replace(general=settings.general.replace(start_at_login=True))


def write_entry(program: str) -> Path:
    real = sys.executable
    try:
        sys.executable = program
        return autostart.set_enabled(True, "linux")
    finally:
        sys.executable = real


def test_start_at_login_off_and_on_without_its_entry(bin_dir):
    assert session(x11(bin_dir))["Start at login"].status == "info"
    row = session(x11(bin_dir), on())["Start at login"]
    assert row.status == "problem"
    assert row.detail == (
        f"on in the settings, but {autostart.autostart_path('linux')} does not exist, so the app does not start at "
        "login"
    )
    assert row.fix == "start Dictation once: while the setting is on, it writes the entry at every start"


def test_an_entry_that_starts_a_removed_virtual_environment(tmp_path, bin_dir):
    gone = str(tmp_path / "removed-venv" / "bin" / "python")
    path = write_entry(gone)
    row = session(x11(bin_dir), on())["Start at login"]
    assert row.status == "problem"
    assert row.detail == (
        f"{path} starts a program that is gone: {gone} does not exist (a moved or deleted virtual environment?)"
    )
    assert row.fix == "start Dictation from the installation you use: it rewrites the entry at every start"
    off = session(x11(bin_dir))["Start at login"]
    assert off.fix == f"turn Start at login on and off again in the settings, or delete {path}"


def test_a_working_entry_and_one_switched_off_in_the_desktop(tmp_path, bin_dir):
    path = write_entry(sys.executable)
    row = session(x11(bin_dir), on())["Start at login"]
    assert (row.status, row.detail) == ("ok", f"{path} starts {sys.executable} -m dictation")
    path.write_text(path.read_text() + "Hidden=true\n")
    row = session(x11(bin_dir), on())["Start at login"]
    assert row.status == "warning" and row.detail == f"{path} is switched off in the desktop's startup settings"


def test_the_users_own_entry_is_checked_but_never_rewritten(tmp_path, bin_dir):
    path = autostart.autostart_path("linux")
    path.parent.mkdir(parents=True)
    path.write_text("[Desktop Entry]\nType=Application\nName=Mine\nExec=/nowhere/dictation\n")
    row = session(x11(bin_dir), on())["Start at login"]
    assert row.status == "problem" and row.detail.startswith(f"{path} (your own entry) starts a program that is gone")
    assert row.fix == f"edit or delete {path}"
    exe = tmp_path / "mine"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    path.write_text(f"[Desktop Entry]\nType=Application\nName=Mine\nExec={exe} --quiet\n")
    assert session(x11(bin_dir), on())["Start at login"].detail == f"{path} (your own entry) starts {exe} --quiet"
