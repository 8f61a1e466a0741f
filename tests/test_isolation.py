"""No test reaches the user's own folders: tests/conftest.py gives every test a home of its own
(HOME, the XDG folders, DICTATION_HOME, the Hugging Face cache and a short runtime folder)."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REAL_HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)  # where the user's own folders are, whatever HOME says


def test_home_and_the_xdg_folders_are_the_tests_own(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "DICTATION_HOME"):
        assert Path(os.environ[name]).is_relative_to(base), (name, os.environ[name])
        assert not Path(os.environ[name]).is_relative_to(REAL_HOME) or base.is_relative_to(REAL_HOME)
    assert Path(os.environ["HF_HOME"]).is_relative_to(base)
    assert "HF_HUB_CACHE" not in os.environ


def test_the_runtime_folder_is_private_and_short_enough_for_a_socket():
    from dictation import ipc

    runtime = Path(os.environ["XDG_RUNTIME_DIR"])
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
    assert len(os.fsencode(runtime / "dictation-0123456789" / "ipc.sock")) <= ipc.MAX_SOCKET_PATH
    assert ipc.socket_dir().parent == runtime


def test_without_a_runtime_folder_the_socket_goes_to_the_tests_cache_not_the_users(monkeypatch, tmp_path):
    """With XDG_RUNTIME_DIR unset the app falls back to <user cache>/dictation/run-*: that used to be
    the real ~/.cache/dictation (126 leftover folders there)."""
    from dictation import ipc

    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setattr(ipc, "RUN_USER", str(tmp_path / "no-run-user"))
    folder = ipc.socket_dir()
    assert folder.parent == Path(os.environ["XDG_CACHE_HOME"]) / "dictation"
    assert not folder.is_relative_to(REAL_HOME / ".cache")


@pytest.mark.skipif(sys.platform == "win32", reason="Unix sockets")
def test_a_started_process_gets_the_tests_folders_too(tmp_path):
    """`dictation status` in a child process names the socket it would use: in this test's runtime folder."""
    proc = subprocess.run(
        [sys.executable, "-m", "dictation", "status", "--json"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stderr
    socket = Path(json.loads(proc.stdout)["socket"])
    assert socket.parent.parent == Path(os.environ["XDG_RUNTIME_DIR"])


HOME_VARIABLES = ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "DICTATION_HOME")


@pytest.fixture(scope="session")
def environment_copied_at_session_start():
    """What a session fixture that starts a server copies once for its clients (tests/output/conftest.py
    `xvfb` and `sway`, tests/audio/conftest.py `pulse_server`): set up before any test's own home."""
    return dict(os.environ)


@pytest.mark.skipif(sys.platform == "win32", reason="Unix sockets")
def test_a_session_fixtures_copy_of_the_environment_holds_the_sessions_home_not_the_users(
    environment_copied_at_session_start, tmp_path_factory, tmp_path
):
    """The copy once named the user's own HOME and no runtime folder, and `dictation toggle` run with it
    (tests/e2e/test_app_e2e.py) made its socket folder in the user's own ~/.cache/dictation."""
    env = environment_copied_at_session_start
    base = tmp_path_factory.getbasetemp()
    for name in (*HOME_VARIABLES, "HF_HOME"):
        assert Path(env[name]).is_relative_to(base), (name, env[name])
    runtime = Path(env["XDG_RUNTIME_DIR"])
    assert runtime.is_dir() and stat.S_IMODE(runtime.stat().st_mode) == 0o700
    nobody = {**env, "DICTATION_HOME": str(tmp_path / "nobody-home")}
    proc = subprocess.run(
        [sys.executable, "-m", "dictation", "status", "--json"], env=nobody, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stderr
    socket = Path(json.loads(proc.stdout)["socket"])
    assert socket.parent.parent == runtime and not socket.is_relative_to(REAL_HOME)
