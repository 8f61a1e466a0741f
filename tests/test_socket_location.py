"""Where the app's command socket lives when nobody tells us (XDG_RUNTIME_DIR unset): a private
folder no other local user can create first, take over or redirect (real folders, owned by another
uid with chown: the tests run as root, or are skipped for that part where they do not)."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from dictation import ipc
from dictation.ipc import IpcError, socket_dir

OTHER_UID = 54321  # no such user: a folder "another user" made


@pytest.fixture
def no_runtime(short_tmp, monkeypatch):
    """No XDG_RUNTIME_DIR, no /run/user/<uid>; the user's cache and the temp folder are the test's
    (in a folder with a short path: the sockets' paths stay under 107 bytes, tests/conftest.py)."""
    tmp_path = short_tmp
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("DICTATION_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(ipc, "RUN_USER", str(tmp_path / "no-run-user"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)  # like /tmp: everyone may create folders here
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    return tmp_path


def taken_by_another_user(path):
    if os.geteuid() != 0:
        pytest.skip("needs root to create a folder owned by another user")
    path.mkdir(mode=0o777)
    os.chown(path, OTHER_UID, OTHER_UID)
    return path


def tmp_candidate(root):
    return root / "tmp" / f"dictation-{os.getuid()}{ipc._home_suffix()}"


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_without_a_runtime_folder_the_socket_goes_to_the_users_own_cache(no_runtime):
    taken_by_another_user(tmp_candidate(no_runtime))  # what blocked the app before
    folder = socket_dir()
    assert folder == no_runtime / "cache" / "dictation" / f"run{ipc._home_suffix()}"
    assert os.lstat(folder).st_uid == os.getuid() and mode(folder) == 0o700
    assert ipc.server_name() == str(folder / "ipc.sock")


def test_the_temp_folder_is_the_last_resort_and_only_when_it_is_ours(no_runtime):
    (no_runtime / "cache").write_text("not a folder")  # the cache cannot be used
    folder = socket_dir()
    assert folder == tmp_candidate(no_runtime)
    assert mode(folder) == 0o700


def test_a_temp_folder_taken_by_another_user_is_refused_with_every_reason(no_runtime):
    (no_runtime / "cache").write_text("not a folder")
    taken = taken_by_another_user(tmp_candidate(no_runtime))
    with pytest.raises(IpcError) as info:
        socket_dir()
    message = str(info.value)
    assert message.startswith("no private folder for the app's socket: ")
    assert f"{taken}: it belongs to another user (uid {OTHER_UID}); refusing it" in message
    assert str(no_runtime / "cache") in message  # and why the cache could not be used
    assert os.lstat(taken).st_uid == OTHER_UID and not os.listdir(taken)  # untouched


def test_a_symbolic_link_in_the_temp_folder_is_refused(no_runtime):
    (no_runtime / "cache").write_text("not a folder")
    ours = no_runtime / "elsewhere"
    ours.mkdir(mode=0o700)
    tmp_candidate(no_runtime).symlink_to(ours)  # planted by someone, pointing anywhere
    with pytest.raises(IpcError, match="it is a symbolic link; refusing it"):
        socket_dir()


def test_our_own_folder_with_loose_permissions_is_made_private(no_runtime):
    folder = no_runtime / "cache" / "dictation" / f"run{ipc._home_suffix()}"
    folder.mkdir(parents=True)
    folder.chmod(0o755)
    assert socket_dir() == folder
    assert mode(folder) == 0o700


def test_a_runtime_folder_that_is_not_ours_is_passed_over(no_runtime, monkeypatch):
    """sudo -E keeps the invoking user's XDG_RUNTIME_DIR: do not put root's socket in it."""
    runtime = taken_by_another_user(no_runtime / "someone-elses-runtime")
    runtime.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    folder = socket_dir()
    assert folder.parent == no_runtime / "cache" / "dictation"
    assert not (runtime / f"dictation{ipc._home_suffix()}").exists()


def test_run_user_is_used_when_the_variable_is_unset(no_runtime, monkeypatch):
    run_user = no_runtime / "run-user"
    (run_user / str(os.getuid())).mkdir(parents=True, mode=0o700)
    monkeypatch.setattr(ipc, "RUN_USER", str(run_user))
    assert socket_dir() == run_user / str(os.getuid()) / f"dictation{ipc._home_suffix()}"


def test_the_session_runtime_folder_comes_first(no_runtime, monkeypatch):
    runtime = no_runtime / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert socket_dir() == runtime / f"dictation{ipc._home_suffix()}"


def test_a_socket_path_too_long_for_the_system_is_passed_over(no_runtime, monkeypatch):
    deep = no_runtime / ("x" * 120)
    monkeypatch.setenv("XDG_CACHE_HOME", str(deep))
    folder = socket_dir()
    assert folder == tmp_candidate(no_runtime)
    assert not deep.exists()


@pytest.mark.parametrize("loose", [0o750, 0o705, 0o755, 0o1777], ids=["750", "705", "755", "1777"])
def test_a_runtime_folder_open_to_group_or_others_is_passed_over_with_the_reason(
    no_runtime, monkeypatch, caplog, loose
):
    """XDG_RUNTIME_DIR with group or other permission bits was not guarded by any test."""
    runtime = no_runtime / "xdg"
    runtime.mkdir()
    runtime.chmod(loose)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    with caplog.at_level("INFO", logger="dictation.ipc"):
        folder = socket_dir()
    assert folder == no_runtime / "cache" / "dictation" / f"run{ipc._home_suffix()}"
    assert not (runtime / f"dictation{ipc._home_suffix()}").exists()  # nothing made in it
    assert mode(runtime) == loose  # not ours to change: the session's folder
    reason = f"the runtime folder {runtime} is open to group or others (mode {loose:o}); passing it over"
    assert f"not using {runtime / f'dictation{ipc._home_suffix()}'} for the app's socket: {reason}" in caplog.messages
