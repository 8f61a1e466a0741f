"""Start at login on all three platforms, with the home folder and environment redirected to tmp_path.

The Exec line is read back with a parser written here from the Desktop Entry specification (string
escapes first, then the quoting rules, then %%), and the command it yields is run for real.
"""

from __future__ import annotations

import configparser
import os
import plistlib
import subprocess
import sys
from pathlib import Path

import pytest

from dictation import autostart
from dictation.autostart import AutostartError, autostart_path, is_enabled, set_enabled


@pytest.fixture
def home(home, monkeypatch):
    """The test's home (tests/conftest.py) with the config folder left to its default, ~/.config."""
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("APPDATA", raising=False)
    return home


def parse_exec(value: str) -> list[str]:
    """Exec value -> argv, per the spec: string escapes, then quoting, then %% -> %."""
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
        if ch == " ":
            if current is not None:
                args.append(current)
            current, i = None, i + 1
        elif ch == '"':
            current, i = current or "", i + 1
            while text[i] != '"':
                if text[i] == "\\" and text[i + 1] in '"`$\\':
                    current, i = current + text[i + 1], i + 2
                else:
                    current, i = current + text[i], i + 1
            i += 1
        else:
            assert ch not in "\"'\\><~|&;$*?#()`", f"reserved {ch!r} outside quotes in {value!r}"
            current, i = (current or "") + ch, i + 1
    if current is not None:
        args.append(current)
    return [arg.replace("%%", "%") for arg in args]


def desktop_entry(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(path.read_text(encoding="utf-8"))
    return parser["Desktop Entry"]


# --- Linux (XDG autostart) ---------------------------------------------------------------------------


def test_linux_entry_starts_this_interpreter_with_the_app(home, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert not is_enabled("linux")
    path = set_enabled(True, "linux")
    assert path == tmp_path / "config" / "autostart" / "dictation.desktop"
    assert is_enabled("linux")
    entry = desktop_entry(path)
    assert entry["Type"] == "Application"
    assert entry["Name"] == "Dictation"
    assert entry["Comment"]
    assert entry["Terminal"] == "false"
    assert entry["X-GNOME-Autostart-enabled"] == "true"
    assert Path(entry["Icon"]).read_bytes().lstrip().startswith(b"<?xml")
    assert parse_exec(entry["Exec"]) == [sys.executable, "-m", "dictation"]
    assert [p.name for p in path.parent.iterdir()] == ["dictation.desktop"]  # no temp file left over


def test_linux_default_folder_is_dot_config_and_relative_xdg_paths_are_ignored(home, monkeypatch):
    assert autostart_path("linux") == home / ".config" / "autostart" / "dictation.desktop"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/config")  # the spec says: ignore it
    assert autostart_path("linux") == home / ".config" / "autostart" / "dictation.desktop"


def test_exec_quoting_survives_an_awkward_interpreter_path(home, tmp_path, monkeypatch):
    """A venv under "my $HOME's "stuff"\\ 100%" still starts: the command read back runs."""
    odd = tmp_path / 'my $env\'s "venv"\\ 100% (ü)' / "bin"
    odd.mkdir(parents=True)
    python = odd / "python"
    python.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(python))
    entry = desktop_entry(set_enabled(True, "linux"))
    argv = parse_exec(entry["Exec"])
    assert argv == [str(python), "-m", "dictation"]
    proc = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("dictation ")


def test_exec_escapes_per_the_spec():
    assert autostart.desktop_exec(["/usr/bin/python3", "-m", "dictation"]) == "/usr/bin/python3 -m dictation"
    assert autostart.desktop_exec(["/a b/py"]) == '"/a b/py"'
    assert autostart.desktop_exec(["50%"]) == "50%%"
    assert autostart.desktop_exec(['a"b']) == '"a\\\\"b"'  # \" inside quotes, then \ -> \\
    assert autostart.desktop_exec(["a\\b"]) == '"a\\\\\\\\b"'  # a literal backslash is four
    assert autostart.desktop_exec([""]) == '""'


def test_disabling_removes_our_entry_and_is_idempotent(home):
    path = set_enabled(True, "linux")
    assert set_enabled(False, "linux") == path
    assert not path.exists() and not is_enabled("linux")
    assert set_enabled(False, "linux") == path  # nothing to remove: fine


def test_enabling_again_rewrites_the_command(home, tmp_path, monkeypatch):
    path = set_enabled(True, "linux")
    moved = tmp_path / "new-venv" / "python"
    moved.parent.mkdir()
    moved.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(moved))
    set_enabled(True, "linux")
    assert parse_exec(desktop_entry(path)["Exec"])[0] == str(moved)


def test_an_entry_the_user_wrote_is_never_removed(home):
    path = autostart_path("linux")
    path.parent.mkdir(parents=True)
    mine = "[Desktop Entry]\nType=Application\nName=My dictation\nExec=dictation --my-flags\n"
    path.write_text(mine)
    assert is_enabled("linux")
    with pytest.raises(OSError, match="was not written by Dictation, so it is left alone") as info:
        set_enabled(False, "linux")  # an OSError: callers that catch file errors catch this one too
    assert isinstance(info.value, AutostartError)
    assert set_enabled(True, "linux") == path  # it already starts the app: kept as it is
    assert path.read_text() == mine


@pytest.mark.parametrize("switch", ["Hidden=true", "X-GNOME-Autostart-enabled=false"])
def test_an_entry_switched_off_in_desktop_settings_counts_as_disabled(home, switch):
    path = set_enabled(True, "linux")
    path.write_text(path.read_text().replace("X-GNOME-Autostart-enabled=true\n", "") + switch + "\n")
    assert not is_enabled("linux")
    set_enabled(True, "linux")
    assert is_enabled("linux")
    assert desktop_entry(path)["X-GNOME-Autostart-enabled"] == "true"


def test_a_write_failure_is_one_line_naming_the_file(home):
    (home / ".config").write_text("a file where the folder should be")
    with pytest.raises(AutostartError) as info:
        set_enabled(True, "linux")
    message = str(info.value)
    assert message.startswith(f"cannot write {autostart_path('linux')}: ") and "\n" not in message


# --- Windows (Startup folder) ------------------------------------------------------------------------


def test_windows_batch_file_starts_pythonw_detached(home, tmp_path, monkeypatch):
    appdata = tmp_path / "José" / "AppData" / "Roaming"
    monkeypatch.setenv("APPDATA", str(appdata))
    install = tmp_path / "Python 100%"
    install.mkdir()
    (install / "python.exe").write_bytes(b"")
    (install / "pythonw.exe").write_bytes(b"")
    monkeypatch.setattr(sys, "executable", str(install / "python.exe"))

    path = set_enabled(True, "win32")
    assert path == appdata / "Microsoft" / "Windows" / "Start Menu" / "Programs" / "Startup" / "dictation.cmd"
    assert is_enabled("win32")
    raw = path.read_bytes()
    lines = raw.decode("utf-8").split("\r\n")
    assert b"\n" not in raw.replace(b"\r\n", b"")  # CRLF only
    assert lines[:2] == ["@echo off", "chcp 65001 >nul"]  # UTF-8 from here on
    start = str(install / "pythonw.exe").replace("%", "%%")
    assert f'start "" "{start}" -m dictation' in lines
    assert any(line.startswith("rem ") and autostart.MARKER in line for line in lines)

    set_enabled(False, "win32")
    assert not path.exists() and not is_enabled("win32")


def test_windows_without_pythonw_uses_python_and_the_default_appdata(home, tmp_path, monkeypatch):
    (tmp_path / "python.exe").write_bytes(b"")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python.exe"))
    path = set_enabled(True, "win32")
    assert path.parent == home / "AppData" / "Roaming" / "Microsoft" / "Windows" / "Start Menu" / "Programs" / "Startup"
    assert f'start "" "{tmp_path / "python.exe"}" -m dictation' in path.read_text(encoding="utf-8")


# --- macOS (LaunchAgent) -----------------------------------------------------------------------------


def test_macos_launch_agent_runs_at_load(home):
    path = set_enabled(True, "darwin")
    assert path == home / "Library" / "LaunchAgents" / "io.github.dictation.plist"
    agent = plistlib.loads(path.read_bytes())
    assert agent["Label"] == "io.github.dictation"
    assert agent["ProgramArguments"] == [sys.executable, "-m", "dictation"]
    assert agent["RunAtLoad"] is True
    assert is_enabled("darwin")
    set_enabled(False, "darwin")
    assert not path.exists() and not is_enabled("darwin")


def test_macos_agent_the_user_wrote_is_left_alone(home):
    path = autostart_path("darwin")
    path.parent.mkdir(parents=True)
    path.write_bytes(plistlib.dumps({"Label": "io.github.dictation", "ProgramArguments": ["/opt/dictation"]}))
    with pytest.raises(AutostartError):
        set_enabled(False, "darwin")
    assert path.exists()


def test_a_frozen_build_starts_its_own_executable(home, monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", "/Applications/Dictation.app/Contents/MacOS/Dictation")
    agent = plistlib.loads(set_enabled(True, "darwin").read_bytes())
    assert agent["ProgramArguments"] == ["/Applications/Dictation.app/Contents/MacOS/Dictation"]


def test_the_platform_defaults_to_this_one(home):
    expected = {"linux": "dictation.desktop", "win32": "dictation.cmd", "darwin": "io.github.dictation.plist"}
    assert autostart_path().name == expected.get(sys.platform, "dictation.desktop")
    assert os.fspath(set_enabled(True)) == os.fspath(autostart_path())
    assert is_enabled()


def test_a_frozen_windows_build_starts_its_windowless_executable(home, tmp_path, monkeypatch):
    """The PyInstaller folder (packaging/pyinstaller) has dictationw.exe beside dictation.exe on Windows."""
    folder = tmp_path / "Dictation"
    folder.mkdir()
    for name in ("dictation.exe", "dictationw.exe"):
        (folder / name).write_bytes(b"")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(folder / "dictation.exe"))
    assert autostart.launch_command("win32") == [str(folder / "dictationw.exe")]
    assert f'start "" "{folder / "dictationw.exe"}"' in set_enabled(True, "win32").read_text(encoding="utf-8")
    assert autostart.launch_command("linux") == [str(folder / "dictation.exe")]  # only Windows has the twin


def test_the_linux_entry_is_the_app_menu_template_plus_the_autostart_key(home):
    """One template for the app menu (dictation install-desktop) and autostart; the command is absolute."""
    from dictation import resources

    text = set_enabled(True, "linux").read_text(encoding="utf-8")
    template = [line for line in resources.desktop_template().splitlines() if not line.startswith(("Exec=", "Icon="))]
    lines = text.splitlines()
    assert lines[0] == f"# {autostart.MARKER}" and lines[-1] == "X-GNOME-Autostart-enabled=true"
    assert [line for line in lines[1:-1] if not line.startswith(("Exec=", "Icon="))] == template
    assert os.path.isabs(parse_exec(desktop_entry(autostart_path("linux"))["Exec"])[0])
