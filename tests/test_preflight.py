"""Before Qt starts: a Qt platform plugin that cannot load, or no display, is one
message on stderr, in the log and as a desktop notification, and exit status 1, not Qt's abort
(status 134, nothing logged).

A system library is hidden without root or a mount namespace: an empty file of the same name in a
folder on LD_LIBRARY_PATH, which the dynamic loader finds first and fails on ("file too short"),
exactly as the real app's Qt plugin loader does. The app runs for real (`python -m dictation`);
``notify-send`` and ``apt`` are stand-ins on PATH, the first recording its arguments.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dictation import preflight, system_packages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Qt's xcb and Wayland plugins")

QT_VARIABLES = (
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XDG_SESSION_TYPE",
    "QT_QPA_PLATFORM",
    "QT_QPA_PLATFORM_PLUGIN_PATH",
    "QT_PLUGIN_PATH",
    "LD_LIBRARY_PATH",
)


@pytest.fixture
def world(tmp_path):
    """A private app home, a PATH with a recording notify-send and an apt, and a folder for hidden libraries."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    notified = tmp_path / "notified"
    script = bin_dir / "notify-send"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {notified}\n')
    (bin_dir / "apt").write_text("#!/bin/sh\nexit 0\n")
    for exe in bin_dir.iterdir():
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in QT_VARIABLES}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        DICTATION_HOME=str(tmp_path / "home"),
        HF_HUB_OFFLINE="1",
        XDG_RUNTIME_DIR=str(tmp_path / "runtime"),
    )
    return type("World", (), {"env": env, "home": tmp_path / "home", "notified": notified, "hidden": hidden})


def hide(world, soname: str) -> None:
    """Make ``soname`` unloadable for processes started with ``world.env``."""
    (world.hidden / soname).write_bytes(b"")
    world.env["LD_LIBRARY_PATH"] = str(world.hidden)


def start_app(world, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dictation"],
        env={**world.env, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_refused(world, proc, message: str) -> None:
    """Exit status 1 (no abort), ``message`` as the one line on stderr, in the private log, and notified."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stderr.splitlines() == [f"dictation: error: {message}"]
    log_dir = world.home / "log"
    assert stat.S_IMODE(log_dir.stat().st_mode) == 0o700
    log_file = log_dir / "dictation.log"
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    lines = log_file.read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f" ERROR   dictation.preflight: {message}")
    args = world.notified.read_text().splitlines()
    assert args[:2] == ["--app-name=Dictation", "--urgency=critical"]
    assert args[3:] == ["Dictation cannot start", message.replace("`", "")]


def test_a_missing_library_of_the_xcb_plugin_is_one_message_and_status_1(world):
    hide(world, "libxcb-cursor.so.0")
    proc = start_app(world, DISPLAY=":99")  # no X server is needed: the check comes first
    message = (
        f'Qt cannot load its "xcb" platform plugin: {world.hidden}/libxcb-cursor.so.0: file too short. '
        "Fix: install the missing system libraries: `sudo apt install libxcb-cursor0`, then start Dictation again"
    )
    assert_refused(world, proc, message)


def test_no_display_is_one_message_and_status_1(world):
    proc = start_app(world)
    message = f"no graphical session to show the app in (DISPLAY is unset): {preflight.SESSION_FIX}"
    assert_refused(world, proc, message)


def test_a_missing_library_of_qt_itself_is_the_same_message(world):
    """libEGL.so.1 is needed by QtGui itself: importing PySide6 fails before any plugin is tried."""
    hide(world, "libEGL.so.1")
    proc = start_app(world, DISPLAY=":99")
    message = (
        f"Qt's libraries cannot be loaded: {world.hidden}/libEGL.so.1: file too short. Fix: install the missing "
        "system libraries: `sudo apt install libegl1`, then start Dictation again"
    )
    assert_refused(world, proc, message)


def test_the_check_passes_here_and_is_quick(world):
    """On this machine Qt can start (xcb with a DISPLAY, Wayland falling back to it, offscreen), and
    the check takes well under a second in a fresh process (most of it mapping Qt's libraries)."""
    script = textwrap.dedent("""
        import json, os, sys, time
        from dictation import preflight
        times, answers = [], []
        for env in json.loads(sys.argv[1]):
            start = time.perf_counter()
            answers.append(preflight.qt_problem({**os.environ, **env}))
            times.append(time.perf_counter() - start)
        print(json.dumps([answers, times]))
    """)
    socket = Path(world.env["XDG_RUNTIME_DIR"]) / "wayland-7"
    socket.parent.mkdir()
    socket.write_bytes(b"")  # the compositor's socket exists; the plugin then loads (no connection is made)
    envs = [{"DISPLAY": ":99"}, {"WAYLAND_DISPLAY": "wayland-7"}, {"QT_QPA_PLATFORM": "offscreen"}]
    import json

    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(envs)], env=world.env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    answers, times = json.loads(proc.stdout)
    assert answers == ["", "", ""]
    assert times[0] < 1.0, times


# --- the decision, with the loader's answers injected ----------------------------------------------


def plugin_tree(tmp_path: Path, *names: str) -> Path:
    root = tmp_path / "plugins"
    (root / "platforms").mkdir(parents=True)
    for name in names:
        (root / "platforms" / name).write_bytes(b"")
    return root


def loader(failing: dict[str, str]):
    """A plugin loader: OSError with the given text for files named in ``failing``."""
    tried = []

    def load(path: Path) -> None:
        tried.append(path.name)
        if path.name in failing:
            raise OSError(failing[path.name])

    load.tried = tried
    return load


def library_loader(missing: set[str]):
    def load(soname: str) -> None:
        if soname in missing:
            raise OSError(f"{soname}: cannot open shared object file: No such file or directory")

    return load


NOT_FOUND = "libxcb-cursor.so.0: cannot open shared object file: No such file or directory"


def test_qt_s_order_of_platforms():
    assert preflight.platform_candidates({}) == ["xcb"]
    assert preflight.platform_candidates({"XDG_SESSION_TYPE": "x11", "DISPLAY": ":0"}) == ["xcb"]
    assert preflight.platform_candidates({"WAYLAND_DISPLAY": "wayland-1"}) == ["wayland", "xcb"]
    assert preflight.platform_candidates({"XDG_SESSION_TYPE": "wayland"}) == ["wayland", "xcb"]
    assert preflight.platform_candidates({"QT_QPA_PLATFORM": "offscreen", "DISPLAY": ":0"}) == ["offscreen"]
    assert preflight.platform_candidates({"QT_QPA_PLATFORM": "wayland:foo=1;xcb"}) == ["wayland", "xcb"]


def test_every_missing_library_goes_into_one_install_command(tmp_path, monkeypatch):
    root = plugin_tree(tmp_path, "libqxcb.so")
    missing = {"libxcb-cursor.so.0", "libxcb-icccm.so.4"}
    for manager, command in (
        ("apt", "sudo apt install libxcb-cursor0 libxcb-icccm4"),
        ("dnf", "sudo dnf install xcb-util-cursor xcb-util-wm"),
        ("pacman", "sudo pacman -S xcb-util-cursor xcb-util-wm"),
        ("zypper", "sudo zypper install 'libxcb-cursor.so.0()(64bit)' 'libxcb-icccm.so.4()(64bit)'"),
    ):
        monkeypatch.setattr(system_packages, "package_manager", lambda which, m=manager: m)
        problem = preflight.qt_problem(
            {"DISPLAY": ":0"},
            root,
            platform="linux",
            load=loader({"libqxcb.so": NOT_FOUND}),
            load_library=library_loader(missing),
        )
        assert problem == (
            f'Qt cannot load its "xcb" platform plugin: {NOT_FOUND}. Fix: install the missing system libraries: '
            f"`{command}`, then start Dictation again"
        )


def test_wayland_falls_back_to_xcb_as_qt_does(tmp_path):
    root = plugin_tree(tmp_path, "libqxcb.so", "libqwayland.so")
    (tmp_path / "wayland-1").write_bytes(b"")
    env = {"WAYLAND_DISPLAY": str(tmp_path / "wayland-1"), "DISPLAY": ":0"}
    load = loader({"libqwayland.so": "libwayland-cursor.so.0: cannot open shared object file"})
    assert preflight.qt_problem(env, root, platform="linux", load=load) == ""
    assert load.tried == ["libqwayland.so", "libqxcb.so"]

    load = loader({"libqwayland.so": "libwayland-cursor.so.0: cannot open", "libqxcb.so": NOT_FOUND})
    missing = {"libwayland-cursor.so.0", "libxcb-cursor.so.0"}
    problem = preflight.qt_problem(env, root, platform="linux", load=load, load_library=library_loader(missing))
    assert problem.startswith(
        'Qt cannot load its platform plugins: "wayland": libwayland-cursor.so.0: cannot open; "xcb": '
    )
    assert "`sudo apt install libxcb-cursor0 libwayland-cursor0`" in problem


def test_a_wayland_session_without_its_compositor_tries_xcb_without_loading_wayland(tmp_path):
    root = plugin_tree(tmp_path, "libqxcb.so", "libqwayland.so")
    load = loader({})
    env = {"XDG_SESSION_TYPE": "wayland", "XDG_RUNTIME_DIR": str(tmp_path), "DISPLAY": ":0"}
    assert preflight.qt_problem(env, root, platform="linux", load=load) == ""
    assert load.tried == ["libqxcb.so"]
    env.pop("DISPLAY")
    problem = preflight.qt_problem(env, root, platform="linux", load=load)
    assert problem.startswith(
        f"no graphical session to show the app in (no Wayland compositor at {tmp_path / 'wayland-0'}; DISPLAY is unset)"
    )


def test_what_cannot_be_told_does_not_stop_the_app(tmp_path):
    """No plugin file where we look (a Qt installed elsewhere), or another platform: Qt decides."""
    load = loader({"libqxcb.so": NOT_FOUND})
    assert preflight.qt_problem({"DISPLAY": ":0"}, tmp_path / "nothing", platform="linux", load=load) == ""
    root = plugin_tree(tmp_path, "libqxcb.so")
    assert preflight.qt_problem({"QT_QPA_PLATFORM": "offscreen"}, root, platform="linux", load=load) == ""
    assert preflight.qt_problem({}, root, platform="win32", load=load) == ""
    assert preflight.qt_problem({}, root, platform="darwin", load=load) == ""


def test_the_plugin_paths_qt_reads_come_first(tmp_path):
    root = plugin_tree(tmp_path, "libqxcb.so")
    own = tmp_path / "own" / "platforms"
    own.mkdir(parents=True)
    (own / "libqxcb.so").write_bytes(b"")
    attempts = preflight.try_platforms({"DISPLAY": ":0", "QT_PLUGIN_PATH": str(tmp_path / "own")}, root, loader({}))
    assert [a.plugin for a in attempts] == [own / "libqxcb.so"]
    env = {"DISPLAY": ":0", "QT_QPA_PLATFORM_PLUGIN_PATH": str(own)}
    assert preflight.plugin_folders(env, root) == [own, root / "platforms"]


def test_a_missing_library_of_pyside6_itself_means_reinstalling_it(tmp_path):
    root = plugin_tree(tmp_path, "libqxcb.so")
    load = loader({"libqxcb.so": "libQt6XcbQpa.so.6: cannot open shared object file: No such file or directory"})
    problem = preflight.qt_problem({"DISPLAY": ":0"}, root, platform="linux", load=load)
    assert problem.endswith(f"Fix: {preflight.PYSIDE_FIX}, then start Dictation again")


def test_an_unrelated_import_error_is_not_a_library_problem():
    assert preflight.import_problem(ImportError("No module named 'PySide6'")) == ""
    text = "libGL.so.1: cannot open shared object file: No such file or directory"
    assert preflight.import_problem(ImportError(text), which=lambda tool: None).startswith(
        f"Qt's libraries cannot be loaded: {text}. Fix: install the missing system libraries: `sudo apt install "
    )


def test_no_notify_send_no_notification_and_a_log_folder_that_cannot_be_made(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DICTATION_HOME", str(tmp_path / "home"))
    (tmp_path / "home").write_text("a file where the folder should be")
    assert preflight.notify("x", {"PATH": str(tmp_path)}) is False
    assert preflight.refuse_to_start("the message", {"PATH": str(tmp_path)}) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "dictation: error: the message"
    assert lines[1].startswith(f"dictation: (not written to the log: {tmp_path / 'home'}") and len(lines) == 2
