"""Start at login keeps starting the installation in use: `autostart.refresh`, run
at every start while the setting is on, makes a missing entry and rewrites a stale one of ours; the
command is read back (`read_entry`) and its program checked, as `dictation doctor` does. Home and
XDG folders are redirected to tmp_path; the commands read back are run for real."""

from __future__ import annotations

import os
import plistlib
import subprocess
import sys

import pytest

from dictation import autostart
from dictation.autostart import MARKER, autostart_path, read_entry, refresh, set_enabled
from tests.test_autostart import parse_exec


@pytest.fixture
def home(home, tmp_path, monkeypatch):
    """The test's home (tests/conftest.py), its config folder outside it (a test puts a file there)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("APPDATA", str(tmp_path / "appdata"))
    return home


def stale_entry(platform: str, tmp_path) -> str:
    """Our entry as an installation in a since-deleted virtual environment wrote it; its interpreter."""
    gone = str(tmp_path / "removed-venv" / "bin" / "python")
    real = sys.executable
    try:
        sys.executable = gone
        set_enabled(True, platform)
    finally:
        sys.executable = real
    return gone


@pytest.mark.parametrize("platform", ["linux", "win32", "darwin"])
def test_a_stale_entry_of_ours_is_rewritten_for_this_installation(home, tmp_path, platform):
    gone = stale_entry(platform, tmp_path)
    before = read_entry(platform)
    assert before.ours and before.command[0] == gone
    assert autostart.missing_program(before.command) == f"{gone} does not exist"

    assert refresh(platform) == autostart_path(platform)
    after = read_entry(platform)
    assert after.command == autostart.launch_command(platform)
    assert autostart.missing_program(after.command) == ""
    assert refresh(platform) is None  # up to date: not written again


def test_the_refreshed_linux_entry_starts_the_app(home, tmp_path):
    stale_entry("linux", tmp_path)
    refresh("linux")
    command = read_entry("linux").command
    assert command == parse_exec(_exec_line(autostart_path("linux")))  # the spec's reading, written independently
    proc = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("dictation "), proc.stderr


def test_a_deleted_entry_is_made_again(home):
    assert read_entry("linux") is None
    path = refresh("linux")
    assert path == autostart_path("linux") and MARKER in path.read_text()
    assert read_entry("linux").enabled


def test_entries_switched_off_or_written_by_the_user_are_left_alone(home, tmp_path):
    stale_entry("linux", tmp_path)
    path = autostart_path("linux")
    switched_off = path.read_text().replace("X-GNOME-Autostart-enabled=true", "X-GNOME-Autostart-enabled=false")
    path.write_text(switched_off)
    assert refresh("linux") is None and path.read_text() == switched_off
    assert not read_entry("linux").enabled

    mine = "[Desktop Entry]\nType=Application\nName=Mine\nExec=/opt/my/dictation --flag %U\n"
    path.write_text(mine)
    assert refresh("linux") is None and path.read_text() == mine
    entry = read_entry("linux")
    assert (entry.ours, entry.enabled, entry.command) == (False, True, ["/opt/my/dictation", "--flag"])


def test_a_write_failure_is_one_line_naming_the_file(home, tmp_path):
    (tmp_path / "config").write_text("a file where the folder should be")
    with pytest.raises(autostart.AutostartError) as info:
        refresh("linux")
    assert str(info.value).startswith(f"cannot write {autostart_path('linux')}: ")


def test_exec_values_read_back_as_written(tmp_path):
    odd = str(tmp_path / 'my $env\'s "venv"\\ 100% (ü)\ttab' / "bin" / "python")
    for args in ([odd, "-m", "dictation"], ["/usr/bin/python3", "-m", "dictation"], ["50%", "", "a b"]):
        value = autostart.desktop_exec(args)
        assert autostart.parse_desktop_exec(value) == args == parse_exec(value)


def test_other_platforms_entries_read_back(home, tmp_path):
    stale_entry("darwin", tmp_path)
    path = autostart_path("darwin")
    agent = plistlib.loads(path.read_bytes())
    assert read_entry("darwin").command == agent["ProgramArguments"]
    path.write_bytes(b"not a plist")
    assert read_entry("darwin").command is None

    folder = tmp_path / "100% José"
    folder.mkdir()
    exe = folder / "pythonw.exe"
    exe.write_bytes(b"")
    real = sys.executable
    try:
        sys.executable = str(folder / "python.exe")
        set_enabled(True, "win32")
    finally:
        sys.executable = real
    assert read_entry("win32").command == [str(exe), "-m", "dictation"]
    assert autostart.missing_program([str(exe)]) == f"{exe} is not executable"


def test_a_program_looked_up_on_path(tmp_path):
    assert autostart.missing_program(["no-such-program-here"], {"PATH": str(tmp_path)}) == (
        "no-such-program-here is not found on PATH"
    )
    assert autostart.missing_program(["sh"], {"PATH": os.defpath}) == ""


def _exec_line(path) -> str:
    return next(line for line in path.read_text().splitlines() if line.startswith("Exec="))[len("Exec=") :]
