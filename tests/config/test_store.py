"""settings.json: tolerant load with backups and logs, atomic save, schema migration."""

from __future__ import annotations

import json
import logging
import os

import pytest

from dictation.config import SCHEMA_VERSION, Adapter, Settings, SettingsError, SettingsStore, to_dict
from dictation.config import migrations as migrations_module
from dictation.config import store as store_module


@pytest.fixture
def path(tmp_path):
    return tmp_path / "settings.json"


def _write(path, data) -> None:
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")


def _changed() -> Settings:
    s = Settings()
    return s.replace(
        engine=s.engine.replace(model="Qwen/Qwen3-ASR-0.6B", device="cuda:1", adapters=(Adapter("/loras/me", 0.7),)),
        transcription=s.transcription.replace(language="zh", context="Grüße 你好, Kubernetes"),
        output=s.output.replace(trailing_space=False, restore_delay_ms=2500),
    )


def _backups(path, kind="bad"):
    return sorted(path.parent.glob(f"{path.name}.{kind}*"))


def test_default_location_follows_dictation_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DICTATION_HOME", str(tmp_path))
    store = SettingsStore()
    assert store.path == tmp_path / "config" / "settings.json"
    store.save(_changed())
    assert store.path.exists()


def test_missing_file_gives_defaults_and_writes_nothing(path):
    report = SettingsStore(path).load_report()
    assert report.settings == Settings()
    assert report.problems == () and report.file_version is None
    assert not path.exists()


def test_save_then_load_round_trips_and_writes_readable_json(path):
    store = SettingsStore(path)
    store.save(_changed())
    assert SettingsStore(path).load() == _changed()
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["transcription"]["context"] == "Grüße 你好, Kubernetes"
    assert "你好" in path.read_text(encoding="utf-8")  # not \\u-escaped: the file stays hand-editable


def test_unknown_keys_are_kept_through_load_change_save(path):
    data = {"schema_version": SCHEMA_VERSION, **to_dict(Settings())}
    data["plugin"] = {"enabled": True}
    data["hotkeys"]["second_hotkey"] = "ctrl+alt+l"
    _write(path, data)
    store = SettingsStore(path)
    s = store.load()
    store.save(s.replace(hotkeys=s.hotkeys.replace(mode="toggle")))
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["plugin"] == {"enabled": True}
    assert saved["hotkeys"]["second_hotkey"] == "ctrl+alt+l"
    assert saved["hotkeys"]["mode"] == "toggle"


@pytest.mark.parametrize("content", ["{not json", "", '{"engine": {"model": "x"}', "\xff\xfe garbage", "[1, 2]"])
def test_corrupt_file_gives_defaults_keeps_a_backup_and_logs(path, caplog, content):
    path.write_bytes(content.encode("latin-1"))
    with caplog.at_level(logging.WARNING, logger="dictation.config.store"):
        report = SettingsStore(path).load_report()
    assert report.settings == Settings()
    assert [p.key for p in report.problems] == ["settings"]
    (backup,) = _backups(path)
    assert backup == report.backup
    assert backup.read_bytes() == content.encode("latin-1")
    assert "settings.json.bad-" in backup.name
    assert "settings:" in caplog.text and str(backup) in caplog.text
    # repaired on disk: the next start is quiet and makes no new backup
    assert report.repaired
    caplog.clear()
    again = SettingsStore(path).load_report()
    assert again.problems == () and again.settings == Settings()
    assert len(_backups(path)) == 1
    assert caplog.text == ""


def test_partly_invalid_file_keeps_good_fields_resets_bad_ones_and_logs_their_names(path, caplog):
    data = {"schema_version": SCHEMA_VERSION, **to_dict(_changed())}
    data["engine"]["dtype"] = "fp8"
    data["output"]["restore_delay_ms"] = 999_999
    data["recording"]["trim_silence"] = "yes"
    data["general"]["history_size"] = "lots"
    original = json.dumps(data)
    _write(path, original)
    with caplog.at_level(logging.WARNING, logger="dictation.config.store"):
        report = SettingsStore(path).load_report()
    s = report.settings
    assert s.engine.model == "Qwen/Qwen3-ASR-0.6B" and s.engine.device == "cuda:1"
    assert s.engine.adapters == (Adapter("/loras/me", 0.7),)
    assert s.transcription == _changed().transcription
    assert s.output.trailing_space is False
    assert s.engine.dtype == "auto"
    assert s.output.restore_delay_ms == Settings().output.restore_delay_ms
    assert s.recording.trim_silence is True
    assert s.general.history_size == Settings().general.history_size
    assert sorted(p.key for p in report.problems) == [
        "engine.dtype",
        "general.history_size",
        "output.restore_delay_ms",
        "recording.trim_silence",
    ]
    for key, value in [
        ("engine.dtype", "'fp8'"),
        ("output.restore_delay_ms", "999999"),
        ("recording.trim_silence", "'yes'"),
        ("general.history_size", "'lots'"),
    ]:
        assert any(key in r.message and value in r.message for r in caplog.records), key
    assert report.backup.read_text(encoding="utf-8") == original
    assert SettingsStore(path).load() == s


def test_bad_backups_are_capped(path):
    for _ in range(store_module.KEEP_BAD_BACKUPS + 3):
        _write(path, "{broken")
        SettingsStore(path).load()
    assert len(_backups(path)) == store_module.KEEP_BAD_BACKUPS


def test_save_refuses_invalid_settings_and_leaves_the_file(path):
    store = SettingsStore(path)
    store.save(_changed())
    before = path.read_bytes()
    s = Settings()
    with pytest.raises(SettingsError) as err:
        store.save(s.replace(output=s.output.replace(restore_delay_ms=-5), engine=s.engine.replace(dtype="x")))
    assert sorted(e.key for e in err.value.errors) == ["engine.dtype", "output.restore_delay_ms"]
    assert "output.restore_delay_ms" in str(err.value)
    assert path.read_bytes() == before


@pytest.mark.parametrize("fail_at", ["write", "fsync", "replace"])
def test_a_failed_save_keeps_the_previous_file_and_leaves_no_temp_files(path, monkeypatch, fail_at):
    store = SettingsStore(path)
    store.save(_changed())
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if fail_at == "write":
        real_fdopen = os.fdopen

        class HalfWriter:
            def __init__(self, fd, mode):
                self.f = real_fdopen(fd, mode)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, payload):
                self.f.write(payload[: len(payload) // 2])  # part of the data reaches the disk...
                raise OSError(28, "No space left on device")  # ...then the disk is full

        monkeypatch.setattr(store_module.os, "fdopen", HalfWriter)
    elif fail_at == "fsync":
        monkeypatch.setattr(store_module.os, "fsync", boom)
    else:
        monkeypatch.setattr(store_module.os, "replace", boom)

    with pytest.raises(OSError, match="No space"):
        store.save(Settings())
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "launch.json",
        "settings.json",
    ]  # the note of the save before
    assert SettingsStore(path).load() == _changed()


def test_v0_flat_file_is_migrated_backed_up_and_written_back(path, caplog):
    v0 = {
        "model": "/models/Qwen3-ASR-1.7B",
        "device": "cuda",
        "language": "German",
        "vocabulary": ["Kubernetes", "PySide6"],
        "hotkey": "F9",
        "mode": "ptt",
        "adapters": ["/loras/accent"],
        "restore_delay": 1.2,
        "trailing_space": False,
        "theme": "dark",
    }
    _write(path, v0)
    with caplog.at_level(logging.INFO):
        report = SettingsStore(path).load_report()
    s = report.settings
    assert report.migrated_from == 0 and report.problems == ()
    assert s.engine.model == "/models/Qwen3-ASR-1.7B" and s.engine.device == "cuda"
    assert s.engine.adapters == (Adapter("/loras/accent"),)
    assert s.transcription.language == "de"
    assert s.transcription.context == "Kubernetes, PySide6"
    assert (s.hotkeys.hotkey, s.hotkeys.mode) == ("f9", "push_to_talk")
    assert s.output.restore_delay_ms == 1200
    assert s.output.trailing_space is False
    assert json.loads(report.backup.read_text(encoding="utf-8")) == v0
    assert report.backup.name == "settings.json.v0"
    written = json.loads(path.read_text(encoding="utf-8"))
    assert written["schema_version"] == SCHEMA_VERSION
    assert written["theme"] == "dark"  # unknown keys survive the migration too
    assert "from schema version 0 to 1" in caplog.text
    again = SettingsStore(path).load_report()
    assert again.settings == s and again.migrated_from is None


def test_migration_with_a_bad_value_resets_only_that_value(path):
    _write(path, {"hotkey": "f9", "restore_delay": "soon"})
    report = SettingsStore(path).load_report()
    assert report.settings.hotkeys.hotkey == "f9"
    assert [p.key for p in report.problems] == ["output.restore_delay_ms"]
    assert report.backup.name == "settings.json.v0"  # one backup of the original is enough


def test_a_failing_migration_step_costs_no_settings(path, monkeypatch):
    def broken(data):
        raise KeyError("oops")

    monkeypatch.setitem(migrations_module.MIGRATIONS, 0, broken)
    _write(path, {"output": {"trailing_space": False}})
    report = SettingsStore(path).load_report()
    assert report.settings.output.trailing_space is False
    assert [p.key for p in report.problems] == ["settings"]
    assert json.loads(report.backup.read_text(encoding="utf-8")) == {"output": {"trailing_space": False}}


def test_a_file_from_a_newer_version_keeps_its_version_and_unknown_keys(path, caplog):
    data = {**to_dict(_changed()), "schema_version": SCHEMA_VERSION + 1, "new_group": {"a": 1}}
    _write(path, data)
    store = SettingsStore(path)
    with caplog.at_level(logging.WARNING):
        s = store.load()
    assert "newer version" in caplog.text
    assert s.extra == {"new_group": {"a": 1}}
    assert s.replace(extra={}) == _changed()
    store.save(s.replace(output=s.output.replace(trailing_space=True)))
    written = json.loads(path.read_text(encoding="utf-8"))
    assert written["schema_version"] == SCHEMA_VERSION + 1
    assert written["new_group"] == {"a": 1}
    assert not _backups(path)


SECRET_WORDS = ("Zyxquorblat", "Quibbleflux", "Vrenthimor")


@pytest.mark.parametrize(
    "content",
    [
        # each breaks in a different place: the words are in the broken value or near it
        '{"transcription": {"context": "Zyxquorblat Quibbleflux Vrenthimor", ',  # not JSON
        '["Zyxquorblat", "Quibbleflux", "Vrenthimor"]',  # not an object
        {"transcription": {"context": ["Zyxquorblat Quibbleflux Vrenthimor"]}},  # not text
        {"transcription": {"context": "Zyxquorblat Quibbleflux Vrenthimor " * 700}},  # too long
        {"output": {"replacements": "Zyxquorblat Quibbleflux Vrenthimor"}},  # not a list
        {"output": {"replacements": [{"to": "Zyxquorblat Quibbleflux Vrenthimor"}]}},  # dropped item
        {"output": {"replacements": [{"from": "Zyxquorblat Quibbleflux", "to": ["Vrenthimor"]}]}},  # bad field
        '{"transcription": {"context": "Zyxquorblat Quibbleflux Vrenthimor"}, "x": ' + "[" * 20_000,
    ],
    ids=[
        "bad-json",
        "not-object",
        "context-not-text",
        "context-too-long",
        "replacements-not-list",
        "replacement-dropped",
        "replacement-bad-field",
        "nested-too-deeply",
    ],
)
def test_settings_problems_never_show_the_users_words(path, caplog, content):
    """Vocabulary and replacements are the user's words: no log line or notification quotes them."""
    _write(path, content)
    with caplog.at_level(logging.DEBUG):
        report = SettingsStore(path).load_report()
    assert report.problems, "the file was meant to have a problem"
    shown = caplog.text + "\n".join(str(p) for p in report.problems)
    assert not [w for w in SECRET_WORDS if w in shown], shown
    assert all(str(p).split(":")[0] in shown for p in report.problems)  # still names the field


def test_invalid_private_settings_are_refused_without_quoting_them(path):
    s = Settings()
    bad = s.replace(transcription=s.transcription.replace(context="Zyxquorblat " * 2000))
    with pytest.raises(SettingsError) as info:
        SettingsStore(path).save(bad)
    assert "transcription.context" in str(info.value) and "longer than 20000" in str(info.value)
    assert "Zyxquorblat" not in str(info.value)


def test_a_30_mb_settings_file_is_set_aside_unread_and_the_defaults_used(path, caplog):
    """The fault run: a 30 MB settings file was accepted and copied (a backup at every start)."""
    data = {"schema_version": SCHEMA_VERSION, **to_dict(_changed())}
    data["transcription"]["context"] = "Kubernetes " * 3_000_000  # ~31 MB of JSON
    _write(path, data)
    original = path.read_bytes()
    assert len(original) > 30_000_000
    with caplog.at_level(logging.WARNING, logger="dictation.config.store"):
        report = SettingsStore(path).load_report()
    assert report.settings == Settings()
    [aside] = _backups(path, "too-large-")
    assert report.backup == aside and aside.read_bytes() == original  # the user's file, renamed, not copied
    assert not path.exists() and _backups(path) == []  # nothing written back, no 30 MB backup copy
    [problem] = report.problems
    assert str(problem) == (
        f"settings: the value is {len(original) / (1 << 20):.1f} MB, over the 1 MB a settings file can be; "
        f"kept as {aside.name}, unread; using the default settings"
    )
    assert [r.getMessage() for r in caplog.records] == [f"settings.json: {problem}"]
    assert "Kubernetes" not in caplog.text
    store = SettingsStore(path)  # the next start: no file, the defaults, nothing to report
    assert store.load_report().problems == ()
    store.save(_changed())
    assert store.load() == _changed()
