"""What the user says is readable by the user alone: folders 0700, files 0600, whatever the umask,
for new installs (each writer) and old ones (repaired at start). Real files, real modes."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest

from dictation import paths, private
from dictation.audio.recordings import save_recording
from dictation.config import SCHEMA_VERSION, History, Settings
from dictation.config.store import SettingsStore

OTHER_UID = 54321


@pytest.fixture(params=[0o022, 0o000], ids=["umask022", "umask000"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def modes(root) -> dict[str, int]:
    """Every folder and file under root (root included), relative name -> mode; links skipped."""
    out = {".": mode(root)}
    for p in root.rglob("*"):
        if not p.is_symlink():
            out[str(p.relative_to(root))] = mode(p)
    return out


def all_private(root) -> dict[str, int]:
    """The entries under root that are not private (empty when all are)."""
    return {name: m for name, m in modes(root).items() if m != (0o700 if (root / name).is_dir() else 0o600)}


# --- the building blocks ------------------------------------------------------------------------


def test_private_dir_creates_missing_folders_0700_whatever_the_umask(tmp_path, umask):
    folder = private.private_dir(tmp_path / "a" / "b" / "c")
    assert folder.is_dir()
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700, 0o700, 0o700]


def test_private_dir_tightens_an_existing_folder_but_never_adds_rights(tmp_path):
    loose, read_only = tmp_path / "loose", tmp_path / "read-only"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    read_only.mkdir()
    read_only.chmod(0o555)
    private.private_dir(loose)
    private.private_dir(read_only)
    assert (mode(loose), mode(read_only)) == (0o700, 0o500)


def test_private_dir_refuses_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="Not a directory"):
        private.private_dir(tmp_path / "f")


def test_create_private_file_is_0600_from_the_start_and_keeps_content(tmp_path, umask):
    new = private.create_private_file(tmp_path / "new")
    assert mode(new) == 0o600 and new.read_bytes() == b""
    old = tmp_path / "old"
    old.write_text("keep me")
    old.chmod(0o644)
    private.create_private_file(old)
    assert mode(old) == 0o600 and old.read_text() == "keep me"


def test_repair_makes_a_whole_tree_private_and_leaves_links_and_strangers_alone(tmp_path):
    root = tmp_path / "data"
    (root / "recordings").mkdir(parents=True)
    for name in ("history.sqlite3", "history.sqlite3-wal", "recordings/rec-1.wav"):
        (root / name).write_text("x")
        (root / name).chmod(0o644)
    (root / "recordings").chmod(0o755)
    root.chmod(0o755)
    outside = tmp_path / "shared.txt"
    outside.write_text("not ours to change")
    outside.chmod(0o644)
    (root / "link").symlink_to(outside)
    changed = private.repair([root])
    assert all_private(root) == {}
    assert set(changed) == {
        root,
        root / "recordings",
        *(root / n for n in ("history.sqlite3", "history.sqlite3-wal")),
    } | {root / "recordings" / "rec-1.wav"}
    assert mode(outside) == 0o644  # the link was not followed
    assert private.repair([root]) == []  # nothing left to do


def test_repair_and_exposed_skip_files_of_another_owner(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    root = tmp_path / "data"
    root.mkdir(mode=0o700)
    theirs = root / "theirs"
    theirs.write_text("x")
    theirs.chmod(0o644)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    assert private.repair([root]) == []
    assert mode(theirs) == 0o644
    assert private.exposed([root]) == [(theirs, 0o644)]  # still reported: the user must see it


def test_exposed_lists_what_others_can_read(tmp_path):
    root = tmp_path / "cfg"
    root.mkdir(mode=0o700)
    root.chmod(0o700)
    (root / "settings.json").write_text("{}")
    (root / "settings.json").chmod(0o640)
    (root / "ok").write_text("{}")
    (root / "ok").chmod(0o600)
    assert private.exposed([root, tmp_path / "missing"]) == [(root / "settings.json", 0o640)]


def test_private_folders_are_the_apps_own(dictation_home):
    assert paths.private_folders() == [dictation_home / "config", dictation_home / "data", dictation_home / "log"]


# --- each writer, on a new install ---------------------------------------------------------------


def test_history_database_and_its_wal_and_shm_are_private(dictation_home, umask):
    with History() as history:
        history.add("Zyxquorblat is a secret word")
        data = dictation_home / "data"
        assert {p.name for p in data.iterdir()} >= {"history.sqlite3", "history.sqlite3-wal", "history.sqlite3-shm"}
        assert all_private(data) == {}


def test_history_of_an_older_install_is_made_private(dictation_home):
    data = dictation_home / "data"
    data.mkdir(parents=True)
    with History(data / "history.sqlite3") as history:
        history.add("old words")
    for p in [data, *data.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    for leftover in ("history.sqlite3-wal", "history.sqlite3-journal"):  # as a crash leaves them
        (data / leftover).write_bytes(b"")
        (data / leftover).chmod(0o644)
    with History(data / "history.sqlite3") as history:
        assert history.recent(1)[0].text == "old words"
        assert all_private(data) == {}


def test_a_damaged_history_is_moved_aside_and_the_new_one_is_private(dictation_home, umask):
    data = dictation_home / "data"
    data.mkdir(parents=True)
    (data / "history.sqlite3").write_bytes(b"this is not a database, it is garbage" * 100)
    with History() as history:
        history.add("new")
    assert len(list(data.glob("history.sqlite3.bad-*"))) == 1
    assert mode(data / "history.sqlite3") == 0o600 and mode(data) == 0o700


def test_settings_folder_file_and_backups_are_private(dictation_home, umask):
    store = SettingsStore()
    s = Settings()
    store.save(s.replace(transcription=s.transcription.replace(context="Zyxquorblat")))
    config = dictation_home / "config"
    assert all_private(config) == {}
    # a broken file from an older version (0644): its backup must not stay readable
    broken = {"schema_version": SCHEMA_VERSION, "general": {"history_size": "lots"}}
    (config / "settings.json").write_text(json.dumps(broken))
    (config / "settings.json").chmod(0o644)
    report = SettingsStore().load_report()
    assert report.backup is not None and report.backup.name.startswith("settings.json.bad-")
    assert all_private(config) == {}
    # a migration's backup of a version-0 file
    (config / "settings.json").write_text(json.dumps({"model": "x"}))
    (config / "settings.json").chmod(0o644)
    assert SettingsStore().load_report().migrated_from == 0
    assert len(list(config.glob("settings.json.v0*"))) == 1
    assert all_private(config) == {}


def test_recordings_folder_and_files_are_private(dictation_home, umask):
    path = save_recording(np.zeros(1600, dtype=np.float32))
    assert path.parent == dictation_home / "data" / "recordings"
    assert all_private(dictation_home / "data") == {}


def test_an_existing_file_is_made_private_without_dropping_this_processs_locks_on_it(tmp_path):
    """Closing any descriptor of a file drops every POSIX lock the process holds on it: opening an
    existing database to tighten its mode would silently release SQLite's locks of another of our
    connections (the history worker reconnecting beside the GUI's reader did exactly that)."""
    import sqlite3
    import subprocess
    import sys

    db = tmp_path / "locked.sqlite3"
    ours = sqlite3.connect(db, isolation_level=None)
    ours.execute("CREATE TABLE t (x)")
    db.chmod(0o644)
    ours.execute("BEGIN IMMEDIATE")  # a RESERVED lock on the file: no other writer may start
    try:
        private.create_private_file(db)
        assert stat.S_IMODE(db.stat().st_mode) == 0o600
        other = subprocess.run(
            [sys.executable, "-c", WRITER, str(db)], capture_output=True, text=True, timeout=30, check=False
        )
        assert other.stdout.strip() == "locked", other.stdout + other.stderr
    finally:
        ours.execute("ROLLBACK")
        ours.close()


WRITER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
try:
    conn.execute("BEGIN IMMEDIATE")
    print("got the lock")
except sqlite3.OperationalError as exc:
    print("locked" if "locked" in str(exc) else exc)
"""
