"""`dictation status --json` says where the command socket is: the path of the
running app's socket, and when none runs the path it would listen on, which depends on
XDG_RUNTIME_DIR and DICTATION_HOME (docs/guide/history-and-files.md). The app's side is a real Unix
socket served from a thread."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from dictation import cli, ipc

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="Unix sockets")


def home_hash(home) -> str:
    return hashlib.sha1(os.path.abspath(home).encode()).hexdigest()[:10]


@pytest.fixture
def no_runtime(short_tmp, monkeypatch):
    tmp_path = short_tmp  # the sockets' paths stay under 107 bytes (tests/conftest.py)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("DICTATION_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(ipc, "RUN_USER", str(tmp_path / "no-run-user"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


def status_json(capsys) -> tuple[int, dict, str]:
    code = cli.main(["status", "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_not_running_prints_the_socket_it_would_use_in_the_runtime_folder(tmp_path, short_tmp):
    runtime = short_tmp  # the socket's path stays under 107 bytes (tests/conftest.py)
    home = tmp_path / "home"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "DICTATION_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-m", "dictation", "status", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == {
        "ok": False,
        "running": False,
        "message": "dictation is not running (start it with `dictation`)",
        "socket": str(runtime / f"dictation-{home_hash(home)}" / "ipc.sock"),
    }
    assert proc.stderr == "dictation: error: dictation is not running (start it with `dictation`)\n"


def test_not_running_without_a_runtime_folder_it_is_in_the_users_cache(no_runtime, capsys):
    code, reply, _ = status_json(capsys)
    expected = no_runtime / "cache" / "dictation" / f"run-{home_hash(no_runtime / 'home')}" / "ipc.sock"
    assert (code, reply["running"], reply["socket"]) == (1, False, str(expected))


def test_running_the_reply_carries_the_socket_it_came_from(no_runtime, capsys):
    path = ipc.socket_path()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    requests = []

    def serve():
        conn, _ = server.accept()
        with conn:
            requests.append(conn.recv(4096))
            conn.sendall(b'{"ok": true, "status": "idle", "model": null, "hotkeys": "x11"}\n')

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        code, reply, err = status_json(capsys)
    finally:
        thread.join(5)
        server.close()
    request = json.loads(requests[0])
    assert request["command"] == "status" and isinstance(request["sent"], float)  # the client's send time
    assert (code, err) == (0, "")
    assert reply == {"ok": True, "status": "idle", "model": None, "hotkeys": "x11", "running": True, "socket": path}


def test_no_private_folder_for_the_socket_is_null_with_the_reason(no_runtime, monkeypatch, capsys):
    monkeypatch.setattr(ipc, "_socket_candidates", lambda: [])
    code, reply, _ = status_json(capsys)
    assert (code, reply["socket"]) == (1, None)
    assert reply["message"].startswith("no private folder for the app's socket")
