"""The model folders a user chose before (``engine.recent_models``): kept in the
settings file, newest first, bounded, and loaded tolerantly like every other list."""

from __future__ import annotations

import json

from dictation.config import RecentModel, Settings, SettingsStore
from dictation.config.settings import RECENT_MODELS_KEPT


def paths(engine) -> list[str]:
    return [r.path for r in engine.recent_models]


def test_choosing_models_keeps_the_folders_newest_first_and_no_repo_ids():
    e = Settings().engine
    e = e.with_model("/models/a").with_model("Qwen/Qwen3-ASR-0.6B").with_model("/models/b")
    assert e.model == "/models/b" and paths(e) == ["/models/b", "/models/a"]
    e = e.with_model("/models/a")  # used again: to the front, not twice
    assert paths(e) == ["/models/a", "/models/b"]
    e = e.with_model("")  # no model: the list stays
    assert e.model == "" and paths(e) == ["/models/a", "/models/b"]
    for i in range(20):
        e = e.with_model(f"/models/m{i}")
    assert len(e.recent_models) == RECENT_MODELS_KEPT and paths(e)[0] == "/models/m19"
    assert paths(e.forget_model("/models/m18")) == [p for p in paths(e) if p != "/models/m18"]


def test_the_folder_in_use_before_the_list_existed_is_kept_when_leaving_it():
    old = Settings().engine.replace(model="/home/me/models/my-asr")  # chosen with an earlier version
    e = old.with_model("Qwen/Qwen3-ASR-1.7B")
    assert e.model == "Qwen/Qwen3-ASR-1.7B" and paths(e) == ["/home/me/models/my-asr"]


def test_the_list_is_saved_and_loaded_with_the_settings(tmp_path):
    store = SettingsStore(tmp_path / "settings.json")
    s = Settings()
    s = s.replace(engine=s.engine.with_model("/models/a").with_model("/models/b.gguf"))
    store.save(s)
    data = json.loads((tmp_path / "settings.json").read_text())
    assert data["engine"]["recent_models"] == [{"path": "/models/b.gguf"}, {"path": "/models/a"}]
    assert store.load() == s


def test_bad_entries_are_dropped_on_load_and_the_rest_kept(tmp_path):
    path = tmp_path / "settings.json"
    data = {"schema_version": 1, "engine": {"recent_models": [{"path": "/models/a"}, {"path": ""}, "x", {"path": 3}]}}
    path.write_text(json.dumps(data))
    report = SettingsStore(path).load_report()
    assert report.settings.engine.recent_models == (RecentModel(path="/models/a"),)
    assert [p.key for p in report.problems] == [
        "engine.recent_models[1]",
        "engine.recent_models[2]",
        "engine.recent_models[3]",
    ]
    written_by_an_older_version = {"schema_version": 1, "engine": {"model": "/models/a"}}
    path.write_text(json.dumps(written_by_an_older_version))
    assert SettingsStore(path).load_report().settings.engine.recent_models == ()
