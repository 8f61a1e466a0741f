"""Settings dataclasses, their metadata, validation and the tolerant JSON codec."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from dictation.config import (
    Adapter,
    FieldInfo,
    RecentModel,
    Replacement,
    Settings,
    field_info,
    from_dict,
    language_choices,
    to_dict,
    validate,
)


def _by_key() -> dict[str, FieldInfo]:
    return {info.key: info for info in field_info()}


def test_defaults_are_valid_and_round_trip_through_json():
    s = Settings()
    assert validate(s) == []
    data = json.loads(json.dumps(to_dict(s)))
    back, problems = from_dict(Settings, data)
    assert problems == []
    assert back == s


def test_defaults_users_depend_on():
    s = Settings()
    assert s.engine.model == ""  # not chosen yet: the app asks
    assert s.hotkeys.hotkey == "ctrl+alt+space"
    assert s.hotkeys.cancel_key == "esc"
    assert s.hotkeys.mode == "push_to_talk"
    assert s.output.restore_clipboard is True
    assert s.output.restore_delay_ms >= 1000  # shorter delays lose pastes in slow apps (field notes)
    assert s.engine.idle_unload_minutes == 0
    assert s.transcription.language == "auto"
    assert s.engine.stream_while_recording is True  # transcribing during speech
    assert s.general.live_preview is True


def test_a_settings_file_without_the_streaming_keys_loads_them_on():
    """Files written before the streaming settings existed get them at their defaults, no migration."""
    data = to_dict(Settings())
    del data["engine"]["stream_while_recording"], data["general"]["live_preview"]
    off = {**data, "engine": {**data["engine"], "stream_while_recording": False}}
    back, problems = from_dict(Settings, data)
    assert problems == [] and back.engine.stream_while_recording and back.general.live_preview
    assert from_dict(Settings, off)[0].engine.stream_while_recording is False


def test_settings_are_frozen_and_replace_builds_a_new_object():
    s = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.output.trailing_space = False  # type: ignore[misc]
    t = s.replace(output=s.output.replace(trailing_space=False))
    assert s.output.trailing_space is True
    assert t.output.trailing_space is False
    assert t.engine is s.engine


def test_every_field_has_label_help_and_the_limits_its_kind_needs():
    infos = field_info()
    assert len(infos) >= 25
    for info in infos:
        assert info.label.strip() and info.help.strip(), info.key
        assert info.group in {"engine", "transcription", "recording", "hotkeys", "output", "general"}, info.key
        assert info.group_label
        if info.kind == "choice":
            values = [v for v, _ in info.choices]
            assert info.default in values, info.key
            assert all(label for _, label in info.choices), info.key
        if info.kind in ("int", "float"):
            assert info.minimum is not None and info.maximum is not None, info.key
            assert info.minimum <= info.default <= info.maximum, info.key
        if info.kind == "list":
            assert info.item_fields and info.item_type in (Adapter, Replacement, RecentModel)
            for item in info.item_fields:
                assert item.label and item.help, f"{info.key}.{item.key}"


def test_enum_fields_offer_exactly_the_documented_choices():
    info = _by_key()
    values = {k: [v for v, _ in info[k].choices] for k in info if info[k].choices}
    assert values["engine.dtype"] == ["auto", "bf16", "fp16", "fp32"]
    assert values["engine.variant"] == ["auto", "bf16", "fp16", "fp32", "int8", "int4"]
    assert values["hotkeys.mode"] == ["push_to_talk", "toggle", "hybrid"]
    assert values["hotkeys.backend"] == ["auto", "x11", "pynput", "evdev", "portal"]
    assert values["output.method"] == ["auto", "paste", "type"]
    assert values["output.paste_chord"] == ["auto", "ctrl+v", "ctrl+shift+v", "shift+insert"]
    assert info["engine.device"].open_choices  # cuda:N is allowed too
    assert info["transcription.context"].multiline


def test_language_choices_come_from_the_engine_list():
    from dictation.asr.text.prompt import LANGUAGES

    choices = _by_key()["transcription.language"].choices
    assert choices[0][0] == "auto"
    assert [(code, name) for code, name in choices[1:]] == [(code, name) for name, code in LANGUAGES]
    assert len(choices) == 31
    assert choices == language_choices()


def test_field_info_get_and_set_address_the_nested_field():
    info = _by_key()["output.restore_delay_ms"]
    s = info.set(Settings(), 2500)
    assert s.output.restore_delay_ms == 2500
    assert info.get(s) == 2500
    assert s.output.trailing_space is True


def test_validate_names_each_bad_field_once():
    s = Settings()
    s = s.replace(
        engine=s.engine.replace(device="gpu", dtype="fp8", adapters=(Adapter(path="", weight=5.0),)),
        output=s.output.replace(restore_delay_ms=-1, trailing_space="yes"),
        recording=s.recording.replace(sound_volume=101),
        hotkeys=s.hotkeys.replace(hotkey="ctrl+ +x"),
    )
    errors = {e.key: e.message for e in validate(s)}
    assert sorted(errors) == [
        "engine.adapters[0].path",
        "engine.adapters[0].weight",
        "engine.device",
        "engine.dtype",
        "hotkeys.hotkey",
        "output.restore_delay_ms",
        "output.trailing_space",
        "recording.sound_volume",
    ]
    assert "0..10000 ms" in errors["output.restore_delay_ms"]
    assert "auto, bf16, fp16, fp32" in errors["engine.dtype"]
    assert "empty" in errors["engine.adapters[0].path"]
    assert "cuda:N" in errors["engine.device"]  # limits in words, not a regular expression


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:3", "mps"])
def test_device_forms_accepted(device):
    s = Settings()
    assert validate(s.replace(engine=s.engine.replace(device=device))) == []


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "cuda:0:1", "CUDA"])
def test_device_forms_refused(device):
    s = Settings()
    assert [e.key for e in validate(s.replace(engine=s.engine.replace(device=device)))] == ["engine.device"]


def test_from_dict_normalizes_case_spacing_and_language_names():
    data = {
        "engine": {"device": " CUDA:1 ", "dtype": "BF16"},
        "transcription": {"language": "German"},
        "hotkeys": {"hotkey": "Ctrl + Alt + Space", "mode": "Toggle"},
    }
    s, problems = from_dict(Settings, data)
    assert problems == []
    assert (s.engine.device, s.engine.dtype) == ("cuda:1", "bf16")
    assert s.transcription.language == "de"
    assert (s.hotkeys.hotkey, s.hotkeys.mode) == ("ctrl+alt+space", "toggle")


def test_from_dict_keeps_valid_fields_and_resets_each_bad_one():
    data = {
        "engine": {"model": "/models/qwen", "dtype": "fp8", "idle_unload_minutes": "5"},
        "transcription": {"language": "Klingon", "context": "Kubernetes, PySide6"},
        "output": {"restore_delay_ms": 2000.0, "trailing_space": 1, "paste_chord": "ctrl+shift+v"},
        "general": "not a group",
    }
    s, problems = from_dict(Settings, data)
    assert s.engine.model == "/models/qwen"
    assert s.transcription.context == "Kubernetes, PySide6"
    assert s.output.restore_delay_ms == 2000 and isinstance(s.output.restore_delay_ms, int)
    assert s.output.paste_chord == "ctrl+shift+v"
    assert s.engine.dtype == "auto" and s.engine.idle_unload_minutes == 0
    assert s.transcription.language == "auto"
    assert s.output.trailing_space is True  # 1 is not a boolean
    assert s.general == Settings().general
    assert sorted(p.key for p in problems) == [
        "engine.dtype",
        "engine.idle_unload_minutes",
        "general",
        "output.trailing_space",
        "transcription.language",
    ]


def test_list_items_keep_valid_fields_drop_items_without_a_required_one():
    data = {
        "engine": {
            "adapters": [
                {"path": "/loras/accent", "weight": 0.5, "enabled": False},
                {"path": "/loras/jargon", "weight": 9, "rank": 16},
                {"weight": 1.0},
                "not an object",
            ]
        },
        "output": {"replacements": [{"from": "pie side", "to": "PySide"}, {"from": "", "to": "x"}]},
    }
    s, problems = from_dict(Settings, data)
    assert s.engine.adapters == (
        Adapter(path="/loras/accent", weight=0.5, enabled=False),
        Adapter(path="/loras/jargon", weight=1.0, extra={"rank": 16}),
    )
    assert s.output.replacements == (Replacement(from_="pie side", to="PySide"),)
    by_key = {p.key: p for p in problems}
    assert sorted(by_key) == [
        "engine.adapters[1].weight",
        "engine.adapters[2]",
        "engine.adapters[3]",
        "output.replacements[1]",
    ]
    assert by_key["engine.adapters[2]"].action == "dropped"
    assert to_dict(s)["output"]["replacements"] == [{"from": "pie side", "to": "PySide"}]


def test_unknown_keys_at_every_level_survive_a_round_trip():
    data = to_dict(Settings())
    data["future_group"] = {"x": [1, 2]}
    data["output"]["future_flag"] = True
    data["engine"]["adapters"] = [{"path": "/a", "weight": 1.0, "enabled": True, "rank": 8}]
    s, problems = from_dict(Settings, json.loads(json.dumps(data)))
    assert problems == []
    assert to_dict(s) == data
    # and through a change made by the app
    s2 = s.replace(output=s.output.replace(trailing_space=False))
    assert to_dict(s2)["output"]["future_flag"] is True
    assert to_dict(s2)["future_group"] == {"x": [1, 2]}


def test_importing_settings_and_loading_defaults_do_not_import_torch(tmp_path):
    script = f"""
import sys
from dictation.config import Settings, SettingsStore, History, field_info, validate
store = SettingsStore({str(tmp_path / "settings.json")!r})
s = store.load()
store.save(s)
assert store.load() == s
assert validate(s) == []
infos = field_info()
with History({str(tmp_path / "h.sqlite3")!r}) as h:
    h.add("x")
heavy = sorted(m for m in ("torch", "numpy", "tokenizers", "PySide6") if m in sys.modules)
print("heavy:", heavy)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "heavy: []"
